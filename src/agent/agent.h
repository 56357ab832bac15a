// tp-agent entry point (placeholder; the agent module defines it).
#pragma once
namespace tp::agent {
int main(int argc, char** argv);
}
