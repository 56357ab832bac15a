#include "agent/agent.h"
namespace tp::agent {
int main(int, char**) { return 0; }
}
