// Tidepool function tier: the program a prestarted `node` runs before its call
// (docs/function-tier.md). Node cannot fork, so instead of a zygote a node process is
// started ahead of each call, fully isolated already (the same namespaces, cgroups, uid
// and seccomp filter as every call), and waits here. The call's pid 1 (the zygote's
// child) writes {argv, env, cwd} to fd TP_FN_CODE_FD and the call's stdin to fd 0; the
// program then runs as `node FILE ARGS...` would run it.
'use strict';
const fs = require('fs');
const Module = require('module');
const codeFd = Number(process.env.TP_FN_CODE_FD);
const readyFd = Number(process.env.TP_FN_READY_FD);
delete process.env.TP_FN_CODE_FD;
delete process.env.TP_FN_READY_FD;
fs.writeSync(readyFd, 'R');
fs.closeSync(readyFd);
const chunks = [];
const buf = Buffer.alloc(65536);
for (;;) {
  let n;
  try {
    n = fs.readSync(codeFd, buf, 0, buf.length, null);
  } catch (e) {
    if (e.code === 'EAGAIN') continue;
    throw e;
  }
  if (n === 0) break;
  chunks.push(Buffer.from(buf.subarray(0, n)));
}
fs.closeSync(codeFd);
const call = JSON.parse(Buffer.concat(chunks).toString('utf8'));
for (const k of Object.keys(process.env)) delete process.env[k];
Object.assign(process.env, call.env);
process.chdir(call.cwd);
process.argv = [process.argv[0], ...call.argv.slice(1)];
process.execArgv = [];
Module.runMain();
