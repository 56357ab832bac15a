// The `tidepool` command-line client: create, run, exec, cp, ls, rm, pause, resume,
// templates, pools, jobs, top, image, log, replay, fn, version.
//
// Promises: talks to tidepoold only through its HTTP API (api/openapi.yaml); the daemon
// is found through --url, else TIDEPOOL_URL, else http://127.0.0.1:7070. Exit codes:
// 0 success; 1 an error (exactly one line "tidepool: <message>" on stderr); 2 a usage
// error; `run` and `exec` exit with the command's own code (128+N when it was killed by
// signal N, 124 when it timed out, 130 when the user interrupted `run`).
// Thread rules: main is called once, from the process's main thread (it installs
// signal handlers for `run`).
#pragma once

namespace tp::cli {

int main(int argc, char** argv);

}  // namespace tp::cli
