"""`tidepool fn run FILE [ARGS] < input` and `tidepool fn languages` against the real daemon."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess


from fn_lib import fn, fn_clean  # noqa: F401  (fixtures)

BUILD = pathlib.Path(os.environ.get("TIDEPOOL_BUILD") or pathlib.Path(__file__).resolve().parents[2] / "build")
CLI = str(BUILD.resolve() / "bin" / "tidepool")


def fn_cli(daemon, *args, input=b""):
    env = dict(os.environ, TIDEPOOL_URL=daemon.url)
    return subprocess.run([CLI, "fn", *args], input=input, capture_output=True, env=env, timeout=120)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_run_python_file_with_stdin_and_args(daemon, fn_clean, tmp_path):
    f = write(tmp_path, "double.py", "import sys\nprint(int(input()) * 2, sys.argv[1:])\nprint('e', file=sys.stderr)")
    p = fn_cli(daemon, "run", f, "x", "--y", input=b"21\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"42 ['x', '--y']\n" and p.stderr == b"e\n"


def test_exit_status_is_the_programs(daemon, fn_clean, tmp_path):
    assert fn_cli(daemon, "run", write(tmp_path, "x.sh", "exit 3")).returncode == 3
    p = fn_cli(daemon, "run", write(tmp_path, "seg.c", "int main(){ volatile int *p = 0; return *p; }"))
    assert p.returncode == 128 + 11, p.stderr


def test_limits_say_so_in_one_line(daemon, fn_clean, tmp_path):
    p = fn_cli(daemon, "run", "--timeout", "300ms", write(tmp_path, "loop.js", "for(;;){}"))
    assert p.returncode == 124 and p.stderr.decode().endswith("tidepool: time limit exceeded\n")
    p = fn_cli(daemon, "run", "--memory", "64M", write(tmp_path, "mem.py", "x = bytearray(256 << 20)"))
    assert p.returncode == 137 and b"memory limit exceeded" in p.stderr


def test_compile_error_shows_the_compiler(daemon, fn_clean, tmp_path):
    p = fn_cli(daemon, "run", write(tmp_path, "bad.cpp", "int main() { return y; }"))
    assert p.returncode == 1
    assert b"error" in p.stderr and p.stderr.decode().endswith("tidepool: compile error\n")


def test_language_from_flag_extension_and_errors(daemon, fn_clean, tmp_path):
    f = write(tmp_path, "prog", "echo via-flag")
    assert fn_cli(daemon, "run", "--lang", "bash", f).stdout == b"via-flag\n"
    p = fn_cli(daemon, "run", f)
    assert p.returncode == 2 and b"--lang" in p.stderr
    p = fn_cli(daemon, "run", write(tmp_path, "x.cob", "x"))
    assert p.returncode == 2 and b"no language" in p.stderr
    p = fn_cli(daemon, "run", "--lang", "cobol", f)
    assert p.returncode == 1 and re.match(rb"^tidepool: [^\n]*unknown language[^\n]*\n$", p.stderr), p.stderr
    p = fn_cli(daemon, "run", str(tmp_path / "missing.py"))
    assert p.returncode == 1 and b"missing.py" in p.stderr


def test_extra_files_and_json(daemon, fn_clean, tmp_path):
    data = write(tmp_path, "input.txt", "payload")
    f = write(tmp_path, "cat.py", "print(open('data.txt').read())")
    p = fn_cli(daemon, "run", "--json", "--file", f"data.txt={data}", f)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verdict"] == "ok" and out["stdout"] == "payload\n"


def test_languages(daemon, fn_clean):
    p = fn_cli(daemon, "languages")
    assert p.returncode == 0
    names = {line.split()[0] for line in p.stdout.decode().splitlines()[1:]}
    assert {"python", "cpp", "c", "nodejs", "bash"} <= names
    j = json.loads(fn_cli(daemon, "languages", "--json").stdout)
    assert any(l["name"] == "cpp" and l["compile"] for l in j["languages"])
