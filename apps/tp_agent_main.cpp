// tp-agent: PID 1 inside every sandbox (src/agent/agent.h), and, as
// `tp-agent --spawner`, the process that starts them (src/spawn/spawner.h).
#include <cstring>

#include "agent/agent.h"
#include "spawn/spawner.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--spawner") == 0)
    return tp::spawn::spawner_main(argc, argv, &tp::agent::main);
  return tp::agent::main(argc, argv);
}
