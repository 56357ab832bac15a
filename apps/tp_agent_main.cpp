// tp-agent: PID 1 inside every sandbox. See src/agent/agent.h.
#include "agent/agent.h"

int main(int argc, char** argv) { return tp::agent::main(argc, argv); }
