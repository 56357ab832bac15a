// daemon_main: tidepoold's entry point (--role all: API + node + embedded store).
#pragma once

namespace tp::api {
int daemon_main(int argc, char** argv);
}
