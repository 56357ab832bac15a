#!/usr/bin/python3
"""Prints the installed packages of the microvm tier's `host` image, one per line as
"name<TAB>version": the host's Essential, required and important packages and python3,
with everything they depend on (Pre-Depends and Depends, every installed alternative).
The container tier binds the whole of /usr; a VM gets a block image instead, and this
set keeps it to what sh, coreutils and python3 need (about 150 MB, not the many GB a
build host's /usr holds)."""
import re
import subprocess

FMT = "${Package}\t${Version}\t${Essential}\t${Priority}\t${Pre-Depends}\t${Depends}\t${db:Status-Abbrev}\n"
out = subprocess.run(["dpkg-query", "-W", "-f", FMT], check=True, capture_output=True, text=True).stdout
info = {}
for line in out.splitlines():
    name, version, essential, priority, pre, deps, status = (line.split("\t") + [""] * 7)[:7]
    if not status.startswith("ii"):
        continue
    info[name.split(":")[0]] = (version, essential, priority, pre + "," + deps)
want = [n for n, (_, e, p, _) in info.items() if e == "yes" or p in ("required", "important")]
want += ["python3", "python3-minimal"]
seen = set()
while want:
    n = want.pop()
    if n in seen or n not in info:
        continue
    seen.add(n)
    for alt in info[n][3].split(","):
        for choice in alt.split("|"):
            dep = re.sub(r"\(.*?\)|:any|:native", "", choice).strip()
            if dep in info:
                want.append(dep)
for n in sorted(seen):
    print(f"{n}\t{info[n][0]}")
