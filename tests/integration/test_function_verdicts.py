"""The function tier's verdicts, for each language (docs/function-tier.md).

Every verdict the native API reports (ok, runtime_error, time_limit, memory_limit,
output_limit, compile_error) from a program written to cause it, in python, bash, c,
cpp and nodejs; and what each language's run looks like from inside (argv, stdin,
files, cwd). After every test the workers are back at their warm state (fn_clean).
"""
from __future__ import annotations

import pytest

from fn_lib import fn, fn_clean  # noqa: F401  (fixtures)

# language -> {verdict case -> program}. "ok" doubles the number on stdin.
PROGRAMS = {
    "python": {
        "ok": "print(int(input()) * 2)",
        "runtime_error": "import sys\nprint('partial')\nsys.exit(3)",
        "crash": "raise ValueError('boom')",
        "time_limit": "while True: pass",
        "memory_limit": "x = []\nwhile True: x.append(bytearray(1 << 24))",
        "output_limit": "while True: print('y' * 1000)",
    },
    "bash": {
        "ok": "read n; echo $((n * 2))",
        "runtime_error": "echo partial; exit 3",
        "crash": "kill -SEGV $BASHPID; sleep 1",
        "time_limit": "while :; do :; done",
        "memory_limit": "tail /dev/zero",
        "output_limit": "yes",
    },
    "c": {
        "ok": "#include <stdio.h>\nint main(){long n; scanf(\"%ld\",&n); printf(\"%ld\\n\", n*2); return 0;}",
        "runtime_error": "#include <stdio.h>\nint main(){puts(\"partial\"); return 3;}",
        "crash": "int main(){volatile int *p = 0; return *p;}",
        "time_limit": "int main(){for(;;){} }",
        "memory_limit": "#include <stdlib.h>\n#include <string.h>\nint main(){for(;;){char*p=malloc(1<<24); memset(p,1,1<<24);} }",
        "output_limit": "#include <stdio.h>\nint main(){for(;;) puts(\"yyyyyyyyyyyyyyyyyyyyyyy\");}",
        "compile_error": "int main( { return 0; }",
    },
    "cpp": {
        "ok": "#include <iostream>\nint main(){long n; std::cin >> n; std::cout << n*2 << std::endl;}",
        "runtime_error": "#include <iostream>\nint main(){std::cout << \"partial\" << std::endl; return 3;}",
        "crash": "#include <stdexcept>\nint main(){ throw std::runtime_error(\"boom\"); }",
        "time_limit": "int main(){ volatile long x = 0; for(;;) ++x; }",
        "memory_limit": "#include <vector>\nint main(){ std::vector<std::vector<char>> v; for(;;) v.emplace_back(1 << 24, 'x'); }",
        "output_limit": "#include <iostream>\nint main(){ for(;;) std::cout << \"yyyyyyyyyyyyyyyyyyyy\\n\"; }",
        "compile_error": "int main() { undeclared(); }",
    },
    "nodejs": {
        "ok": "const n = Number(require('fs').readFileSync(0, 'utf8')); console.log(n * 2);",
        "runtime_error": "console.log('partial'); process.exit(3);",
        "crash": "throw new Error('boom');",
        "time_limit": "for (;;) {}",
        "memory_limit": "const a = []; for (;;) a.push(Buffer.alloc(1 << 24, 1));",
        "output_limit": "const fs = require('fs'); for (;;) fs.writeSync(1, 'y'.repeat(1000) + '\\n');",
    },
}


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_ok(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["ok"], stdin="21\n")
    assert r.verdict == "ok", r
    assert r.exit_code == 0 and r.signal == 0
    assert r.stdout == "42\n"
    assert r.wall_time > 0 and r.memory_peak_bytes > 0
    if lang in ("c", "cpp"):
        assert r.compile is not None and r.compile.ok
    else:
        assert r.compile is None


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_runtime_error_exit_code(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["runtime_error"])
    assert r.verdict == "runtime_error", r
    assert r.exit_code == 3
    assert r.stdout == "partial\n"


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_runtime_error_crash(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["crash"])
    assert r.verdict == "runtime_error", r
    if lang == "python":
        assert r.exit_code == 1
        # As `python3 main.py` reports it: no frame of the zygote in the traceback.
        assert r.stderr.startswith("Traceback (most recent call last):\n  File \"/tmp/main.py\", line 1")
        assert r.stderr.endswith("ValueError: boom\n")
    elif lang == "nodejs":
        assert r.exit_code == 1 and "Error: boom" in r.stderr
    else:
        assert r.exit_code is None and r.signal in (6, 11), r


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_time_limit(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["time_limit"], timeout=0.5)
    assert r.verdict == "time_limit", r
    assert r.wall_time >= 0.5


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_memory_limit(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["memory_limit"], memory_mb=128, timeout=20)
    assert r.verdict == "memory_limit", r
    assert r.memory_peak_bytes >= 100 << 20
    assert r.memory_peak_bytes <= 128 << 20


@pytest.mark.parametrize("lang", sorted(PROGRAMS))
def test_output_limit(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["output_limit"], max_output_bytes=65536, timeout=20)
    assert r.verdict == "output_limit", r
    assert len(r.stdout_bytes) == 65536 and r.stdout_truncated


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_compile_error(fn_clean, lang):
    r = fn_clean.run_code(lang, PROGRAMS[lang]["compile_error"])
    assert r.verdict == "compile_error", r
    assert r.compile is not None and r.compile.exit_code not in (0, None)
    assert "error" in r.compile.stderr
    assert r.exit_code is None and r.stdout == ""
    # The same program fails the same way: remembered, not compiled again.
    again = fn_clean.run_code(lang, PROGRAMS[lang]["compile_error"])
    assert again.verdict == "compile_error" and again.compile_cached


def test_compiled_program_is_cached(fn_clean):
    src = "#include <cstdio>\nint main(int c, char** v){ std::printf(\"%d %s\\n\", c, v[1]); }"
    first = fn_clean.run_code("cpp", src, args=["a"])
    second = fn_clean.run_code("cpp", src, args=["b"])
    assert first.stdout == "2 a\n" and second.stdout == "2 b\n"
    assert not first.compile_cached and second.compile_cached


@pytest.mark.parametrize("lang,src", [
    ("python", "import os, sys\nprint(sys.argv[1:], os.getcwd(), open('data.txt').read(), os.environ['K'])"),
    ("bash", "echo \"[$1, $2]\" $(pwd) $(cat data.txt) $K"),
    ("nodejs", "console.log(process.argv.slice(2), process.cwd(), require('fs').readFileSync('data.txt', 'utf8'), process.env.K)"),
])
def test_argv_files_cwd_env(fn_clean, lang, src):
    r = fn_clean.run_code(lang, src, args=["x", "y z"], files={"data.txt": "D"}, env={"K": "v"})
    assert r.ok, r
    assert "/tmp" in r.stdout and "D" in r.stdout and "v" in r.stdout and "x" in r.stdout


def test_binary_stdin_and_output(fn_clean):
    r = fn_clean.run_code("python", "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])",
                          stdin=bytes(range(256)))
    assert r.ok and r.stdout_bytes == bytes(range(256))[::-1]


def test_fetch_files(fn_clean):
    r = fn_clean.run_code("bash", "echo out > result.txt; mkdir -p d; printf x > d/y",
                          fetch_files=["result.txt", "d/y", "absent"])
    assert r.ok, r
    assert r.files == {"result.txt": b"out\n", "d/y": b"x"}
    assert r.missing_files == ["absent"]


def test_python_behaves_like_a_fresh_interpreter(fn_clean):
    src = ("import sys, random, atexit\n"
           "assert __name__ == '__main__'\n"
           "atexit.register(lambda: print('atexit ran'))\n"
           "print(random.random())\n"
           "class C: pass\n"
           "import pickle; print(type(pickle.loads(pickle.dumps(C()))).__name__)\n"
           "sys.exit('bye')")
    a = fn_clean.run_code("python", src)
    b = fn_clean.run_code("python", src)
    assert a.exit_code == 1 and a.stderr == "bye\n", a
    assert a.stdout.splitlines()[1:] == ["C", "atexit ran"]
    # Every child reseeds: the zygote's random state is not shared.
    assert a.stdout.splitlines()[0] != b.stdout.splitlines()[0]


def test_syntax_error_is_reported_like_python(fn_clean):
    r = fn_clean.run_code("python", "print(")
    assert r.verdict == "runtime_error" and r.exit_code == 1
    assert 'File "/tmp/main.py", line 1' in r.stderr and "SyntaxError" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_language_and_bad_limits(fn_clean):
    import tidepool
    with pytest.raises(tidepool.InvalidArgument, match="unknown language 'cobol'.*python"):
        fn_clean.run_code("cobol", "DISPLAY 'x'.")
    with pytest.raises(tidepool.InvalidArgument, match="timeout"):
        fn_clean.run_code("python", "1", timeout=10 ** 6)
    with pytest.raises(tidepool.InvalidArgument, match="scratch"):
        fn_clean.run_code("python", "1", files={"../escape": "x"})


@pytest.mark.parametrize("lang,src", [
    ("python", "import os, signal\nprint('x', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\nprint('not reached')"),
    ("bash", "echo x; kill -TERM $$; echo not reached"),
    ("c", "#include <signal.h>\n#include <stdio.h>\nint main(){ puts(\"x\"); fflush(stdout); raise(SIGTERM); puts(\"not reached\"); }"),
])
def test_a_program_that_signals_itself_dies_of_it(fn_clean, lang, src):
    r = fn_clean.run_code(lang, src)
    assert r.verdict == "runtime_error" and r.signal == 15 and r.exit_code is None, r
    assert r.stdout == "x\n"


def test_abort_is_sigabrt(fn_clean):
    r = fn_clean.run_code("c", "#include <stdlib.h>\nint main(){ abort(); }")
    assert r.signal == 6, r
