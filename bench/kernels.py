"""`make bench-kernels`: single-thread G weights/s of moepack's kernels vs llama.cpp's dot products.

    python -m bench.kernels [--repeat 3] [--variants native,avx2] [--cpu N] [--name kernels]
                            [--no-write|--render]

llama.cpp's side is ggml's CPU library built from the sources vendored in the llama-cpp-python
sdist (pip download, then cmake builds only ggml-base + ggml-cpu, statically, once; cached under
build/ggml/). Two builds: `native` (-march=native, llama.cpp's default GGML_NATIVE build) and
`avx2` (the stock x86-64 build without AVX-512, for moepack's AVX2 path on the same machine).
bench/kernels_ggml.c times Q3_K, Q4_K, IQ3_XXS (and Q6_K, Q8_0 as trunk references) vec_dot
over every row, codes in RAM and in cache, plus the activation quantisation on its own.

moepack's side is runtime/tests_c/bench_kernels.c (`make -C runtime bench-kernels`), expected to
print one JSON object per line with at least "codec", "rows", "cols" and "gws" (or "gws_best"),
optionally "path" (kernel path, e.g. vbmi/avx2/scalar) and "mode" ("ram"/"cache", default ram).

The engines alternate, `--repeat` rounds, all pinned to one CPU; llama.cpp's speed is bimodal on
shared VMs, so each figure is the best over rounds with the range of the per-round bests.
Writes bench/results/kernels.json and the "Expert kernels" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.doc_sections import replace_section
from bench.machine import cpu_simd_flags, git_commit, lscpu, utc_now
from moepack.safefs import UnsafePathError, plain_name

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "ggml"
RESULTS = ROOT / "bench" / "results"
LLAMA_CPP_PYTHON = "0.3.36"
SHAPES = ("4096x1536", "1536x4096", "7168x2048", "2048x7168")
TYPES = ("q3_K", "q4_K", "iq3_xxs", "q6_K", "q8_0")
REFS = ("q3_K", "q4_K", "iq3_xxs")  # the ratio columns
TWIN = {"q8": "q8_0", "q6": "q6_K", "q4": "q4_K"}  # trunk codec -> llama.cpp type of its size
# cmake options per build; both static, single-threaded use, no OpenMP.
COMMON = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF",
          "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF", "-DGGML_CCACHE=OFF"]
VARIANTS = {"native": ["-DGGML_NATIVE=ON"],
            "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF"]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw) -> None:
    log("  $ " + " ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, **kw)


# ---------------------------------------------------------------- llama.cpp's ggml, built once

def ggml_sources() -> Path:
    """build/ggml/src: ggml as vendored in the llama-cpp-python sdist."""
    src = BUILD / "src"
    mark = src / ".llama-cpp-python-version"
    if mark.exists() and mark.read_text() == LLAMA_CPP_PYTHON:
        return src
    shutil.rmtree(src, ignore_errors=True)
    sdist_dir = BUILD / "sdist"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    tgz = sdist_dir / f"{name}.tar.gz"
    if not tgz.exists():
        # Build isolation gives pip the sdist's backend (scikit-build-core) for its metadata.
        sh([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
            "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(sdist_dir)])
    prefix = f"{name}/vendor/llama.cpp/ggml/"
    tmp = BUILD / "src.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tgz) as tf:
        members = []
        for m in tf.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    (tmp / "ggml.pc.in").touch()  # left out of the sdist; only `install` reads it
    (tmp / mark.name).write_text(LLAMA_CPP_PYTHON)
    tmp.rename(src)
    return src


def cmake_exe() -> str:
    exe = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if exe and subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
        return exe
    sh([sys.executable, "-m", "pip", "install", "--quiet", "cmake"])
    return str(Path(sys.executable).parent / "cmake")


def build_ggml(variant: str, jobs: int) -> dict:
    """Static libggml-base.a + libggml-cpu.a for one variant (cached) and the harness binary."""
    out = BUILD / variant
    stamp = out / "build.json"
    libs = [out / "src" / "libggml-cpu.a", out / "src" / "libggml-base.a"]
    args = COMMON + VARIANTS[variant]
    source = f"llama-cpp-python {LLAMA_CPP_PYTHON} sdist, vendor/llama.cpp/ggml"
    info = json.loads(stamp.read_text()) if stamp.exists() else {}
    if (info.get("cmake_args") != args or info.get("source") != source
            or not all(p.exists() for p in libs)):
        src = ggml_sources()
        cmake = cmake_exe()
        log(f"building ggml ({variant}) from llama-cpp-python {LLAMA_CPP_PYTHON}, {jobs} job(s)")
        t0 = time.perf_counter()
        shutil.rmtree(out / "quant", ignore_errors=True)  # codes of another ggml
        sh(["nice", cmake, "-S", str(src), "-B", str(out), *args], stdout=subprocess.DEVNULL)
        sh(["nice", cmake, "--build", str(out), "--target", "ggml-cpu", "-j", str(jobs)],
           stdout=subprocess.DEVNULL)
        flags = ""
        for line in (out / "src/CMakeFiles/ggml-cpu.dir/flags.make").read_text().splitlines():
            if line.startswith("C_FLAGS ="):
                flags = line.split("=", 1)[1].strip()
        info = {"cmake_args": args, "ggml_cpu_c_flags": flags, "build_s":
                round(time.perf_counter() - t0, 1), "jobs": jobs,
                "source": source}
        stamp.write_text(json.dumps(info, indent=1))
    exe = out / "kernels_ggml"
    c = ROOT / "bench" / "kernels_ggml.c"
    if not exe.exists() or exe.stat().st_mtime < max(c.stat().st_mtime, stamp.stat().st_mtime):
        sh(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", f"-I{BUILD / 'src' / 'include'}",
            str(c), *map(str, libs), "-lstdc++", "-lm", "-lpthread", "-o", str(exe)])
    (out / "quant").mkdir(exist_ok=True)
    return info


# ------------------------------------------------------------------------------ running

def pinned(cpu: int):
    return lambda: os.sched_setaffinity(0, {cpu})


def json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def run_ggml(variant: str, cpu: int, types: str, shapes: str, ram_mib: int,
             sweeps: int) -> list[dict]:
    out = BUILD / variant
    p = subprocess.run([str(out / "kernels_ggml"), "--types", types, "--shapes", shapes,
                        "--ram-mib", str(ram_mib), "--sweeps", str(sweeps), "--cache-dir",
                        str(out / "quant")], capture_output=True, text=True, check=True,
                       preexec_fn=pinned(cpu))
    recs = json_lines(p.stdout)
    for r in recs:
        r["variant"] = variant
        if r.get("quantize_s", 0) < 0:
            r["quantize_s"] = None  # codes read from build/ggml/<variant>/quant
    return recs


RUNTIME = ROOT / "runtime"
MOEPACK_SRC = RUNTIME / "tests_c" / "bench_kernels.c"


def run_moepack(cpu: int, ram_mib: int) -> list[dict]:
    """The moepack harness with the same "RAM" span as llama.cpp's (its own default is smaller)."""
    p = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(RUNTIME),
                        "bench-kernels", f"BENCH_KERNELS_ARGS=--ram-mib {ram_mib}"],
                       capture_output=True, text=True,
                       preexec_fn=pinned(cpu))
    if p.returncode != 0:
        raise RuntimeError(f"make -C runtime bench-kernels failed (rc {p.returncode}): "
                           f"{p.stderr.strip()[-2000:]}")
    return moepack_records(p.stdout)


def moepack_records(stdout: str) -> list[dict]:
    """Normalise the moepack harness's lines (see the module docstring)."""
    recs = []
    for r in json_lines(stdout):
        if "shape" in r and "rows" not in r:
            r["rows"], r["cols"] = (int(x) for x in str(r["shape"]).split("x"))
        g = next((r[k] for k in ("gws_best", "gws", "g_weights_s") if k in r), None)
        if "codec" not in r or "rows" not in r or g is None:
            continue
        r.update(engine="moepack", gws_best=float(g))
        r.setdefault("mode", "ram")
        r["path"] = str(r.get("path") or r.get("kernel") or "")
        recs.append(r)
    return recs


# ------------------------------------------------------------------------- summary

def key(r: dict) -> tuple:
    name = r.get("variant") if r["engine"] == "llama.cpp" else r.get("path", "")
    return (r["engine"], name, r["codec"], int(r["rows"]), int(r["cols"]), r["mode"])


def summarise(runs: list[dict]) -> list[dict]:
    """Best, worst and median of the per-round bests, per engine/build/codec/shape/mode."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if "codec" in r and r.get("gws_best") is not None:
            groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in groups.items():
        g = sorted(float(r["gws_best"]) for r in rs)
        row = {"engine": k[0], "build": k[1], "codec": k[2], "rows": k[3], "cols": k[4],
               "mode": k[5], "gws_best": g[-1], "gws_lo": g[0], "gws_median": g[len(g) // 2],
               "rounds": len(g)}
        acts = [r["act_us_best"] for r in rs if r.get("act_us_best") is not None]
        if acts:
            row["act_us_best"] = min(acts)
        with_act = [r["gws_with_act"] for r in rs if r.get("gws_with_act") is not None]
        if with_act:
            row["gws_with_act_best"] = max(with_act)
        out.append(row)
    return out


def ref_build(path: str, variants: list[str]) -> str:
    """moepack's AVX2 path is compared with ggml's AVX2 build, everything else with native."""
    return "avx2" if "avx2" in path.lower() and "avx2" in variants else variants[0]


def ratios(summary: list[dict], variants: list[str]) -> None:
    idx = {(s["engine"], s["build"], s["codec"], s["rows"], s["cols"], s["mode"]): s
           for s in summary}
    for s in summary:
        if s["engine"] != "moepack":
            continue
        b = ref_build(s["build"], variants)
        s["ref_build"] = b
        for t in REFS + tuple(v for k, v in TWIN.items() if s["codec"] == k):
            ref = idx.get(("llama.cpp", b, t, s["rows"], s["cols"], s["mode"]))
            if ref:
                s[f"vs_{t}"] = round(s["gws_best"] / ref["gws_best"], 3)


def _g(s: dict) -> str:
    spread = f" ({s['gws_lo']:.1f}-{s['gws_best']:.1f})" if s["rounds"] > 1 else ""
    return f"{s['gws_best']:.1f}{spread}"


def markdown(res: dict) -> str:
    summ, variants = res["summary"], res["variants"]
    hw = res["hardware"]
    lines = [
        f"## Expert kernels: {res['date']}, commit {res['commit']}", "",
        f"`make bench-kernels` (`python -m bench.kernels --repeat {res['repeat']}`). "
        f"{hw.get('Model name', '?')}, SIMD flags: {' '.join(res['cpu_simd_flags'])}; "
        f"{hw.get('L3 cache', '?')} L3; {hw.get('kernel', '')}. One thread pinned to CPU "
        f"{res['cpu']}; load average at start {res['load_avg_start'][0]:.2f}"
        + (" (**shared machine: other work was running; figures are noisy**)."
           if res["load_avg_start"][0] > 0.5 else "."), "",
        "G weights/s per core: best over rounds (range of the per-round bests in brackets). "
        f"\"RAM\": the matrix copied to fill {res['ram_mib']} MiB{moepack_span(res)} and cycled; "
        "\"cache\": one copy, repeated. llama.cpp = ggml "
        f"{res['ggml'][variants[0]].get('version', '?')} "
        f"(llama-cpp-python {LLAMA_CPP_PYTHON}) `vec_dot` one row per call on an activation "
        "already quantised; \"act quant\" is that quantisation (to Q8_K, Q8_0 for q8_0), once "
        "per matrix, timed apart (moepack's own figure includes its table build)."]
    if res["read_gbs"]:
        rb = res["read_gbs"]
        lines.append(f"Single-thread streaming read of the same {res['ram_mib']} MiB: "
                     f"{max(rb):.1f} GB/s ({min(rb):.1f}-{max(rb):.1f}); a codec at b bytes "
                     "per weight cannot beat that / b G weights/s in RAM.")
    lines.append("")
    for v in variants:
        g = res["ggml"][v]
        arch = " ".join(f for f in g["ggml_cpu_c_flags"].split() if f.startswith("-m"))
        lines.append(f"- ggml `{v}`: ggml-cpu built with `{arch}`, compiled for "
                     f"{', '.join(k for k, on in g.get('compiled_for', {}).items() if on)}; "
                     f"built in {g['build_s']} s ({g['jobs']} job(s))")
    cols = [(v, m) for v in variants for m in ("ram", "cache")]
    lines += ["", "| shape (rows x cols) | llama.cpp type | bytes/w | "
              + " | ".join(f"{'RAM' if m == 'ram' else 'cache'} {v}" for v, m in cols)
              + " | act quant µs |", "|---|---|---:|" + "---:|" * (len(cols) + 1)]
    bpw = {(r["codec"], int(r["rows"]), int(r["cols"])): r["bytes_per_weight"]
           for r in res.get("runs", []) if r.get("bytes_per_weight")}
    cell = {(s["rows"], s["cols"], s["codec"], s["build"], s["mode"]): s
            for s in summ if s["engine"] == "llama.cpp"}
    rows = sorted({(k[0], k[1], k[2]) for k in cell}, key=lambda k: (
        SHAPES.index(f"{k[0]}x{k[1]}") if f"{k[0]}x{k[1]}" in SHAPES else 99,
        TYPES.index(k[2]) if k[2] in TYPES else 99, k))
    for r, c, t in rows:
        got = [cell.get((r, c, t, v, m)) for v, m in cols]
        act = next((g["act_us_best"] for g in got if g and "act_us_best" in g), None)
        b = bpw.get((t, r, c))
        lines.append(f"| {r}x{c} | {t} | {f'{b:.3f}' if b else ''} | "
                     + " | ".join(_g(g) if g else "" for g in got)
                     + f" | {f'{act:.2f}' if act else ''} |")
    mp = [s for s in summ if s["engine"] == "moepack"]
    if mp:
        lines += ["", "moepack / llama.cpp (best vs best, same mode, same shape; AVX2 paths vs "
                  "ggml's avx2 build):", "",
                  "| shape | path | codec | mode | G w/s | vs Q3_K | vs Q4_K | vs IQ3_XXS "
                  "| vs twin |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
        for s in sorted(mp, key=lambda s: (s["rows"], s["cols"], s["build"], s["codec"],
                                           s["mode"])):
            twin = TWIN.get(s["codec"])
            cells = [f"{s.get(f'vs_{t}', float('nan')):.2f}x" for t in REFS]
            tw = f"{s[f'vs_{twin}']:.2f}x ({twin})" if twin and f"vs_{twin}" in s else ""
            lines.append(f"| {s['rows']}x{s['cols']} | {s['build']} | {s['codec']} | "
                         f"{s['mode']} | {s['gws_best']:.1f} | {' | '.join(cells)} | {tw} |")
    else:
        lines += ["", f"moepack's side: {res['moepack_missing']}"]
    lines += ["", "Notes: weights are seeded Student-t (4 dof), quantised by ggml without an "
              "importance matrix. llama.cpp's default (extra buffer types on) repacks Q4_K, Q6_K "
              "and Q8_0 into interleaved rows with their own gemv on AVX2; this is the plain "
              "`vec_dot` (what bench/llama.py runs, extra buffer types off). Q3_K and IQ3_XXS "
              "have no x86 repack: for them `vec_dot` is what llama.cpp runs. On a shared VM "
              "the per-round bests vary up to 2x; quote figures from a quiet machine. Raw "
              f"per-round records: bench/results/{res.get('name', 'kernels')}.json."]
    return "\n".join(lines) + "\n"


def write_benchmarks_md(section: str, name: str = "kernels") -> None:
    replace_section(ROOT / "BENCHMARKS.md", name, section)


def moepack_span(res: dict) -> str:
    """Before 8ced147 moepack's harness cycled its own default span, 128 MiB."""
    mr = res.get("moepack_ram_mib", 128)
    return "" if mr == res["ram_mib"] else f" ({mr} MiB for moepack's harness)"


def ram_mode_mib(l3: str) -> int:
    """The "RAM" mode's span: twice the L3 lscpu reports ("480 MiB (1 instance)"), at least
    256 MiB, so the codes stream from memory (a 256 MiB span sat inside a Xeon VM's 480 MiB L3
    and read some of its q8 rows about 10 % faster than a 1.5 GiB one)."""
    m = re.match(r"\s*([\d.]+)\s*([KMG])i?B", l3)
    if not m:
        return 256
    mib = float(m.group(1)) * {"K": 1 / 1024, "M": 1, "G": 1024}[m.group(2)]
    return max(256, int(2 * mib + 0.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds, engines alternating")
    ap.add_argument("--variants", default="native,avx2", help="ggml builds: native, avx2")
    ap.add_argument("--types", default=",".join(TYPES), help="ggml types")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ram-mib", type=int, default=None,
                    help="copies fill this; default: twice the L3, at least 256 MiB")
    ap.add_argument("--sweeps", type=int, default=5, help="timed sweeps per run (best kept)")
    ap.add_argument("--cpu", type=int, default=None, help="pin here (default: last allowed)")
    ap.add_argument("--build-jobs", type=int, default=1, help="make jobs for the ggml build")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the BENCHMARKS.md section from bench/results/NAME.json")
    ap.add_argument("--name", default="kernels",
                    help="results file bench/results/NAME.json and BENCHMARKS.md section NAME "
                         "(another name keeps a second machine's figures beside the first's)")
    a = ap.parse_args()
    try:
        plain_name(a.name, "--name")
    except UnsafePathError as e:
        ap.error(str(e))
    results = RESULTS / f"{a.name}.json"
    if a.render:
        write_benchmarks_md(markdown(json.loads(results.read_text())), a.name)
        return
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v}; known: {', '.join(VARIANTS)}")
    cpu = a.cpu if a.cpu is not None else max(os.sched_getaffinity(0))
    hw = lscpu()
    if a.ram_mib is None:
        a.ram_mib = ram_mode_mib(hw.get("L3 cache", ""))

    ggml = {v: build_ggml(v, a.build_jobs) for v in variants}
    have_moepack = MOEPACK_SRC.exists()
    missing = ("" if have_moepack else "missing: runtime/tests_c/bench_kernels.c does not exist "
               "yet (it comes with the kernel rewrite); only llama.cpp was measured")
    if missing:
        log(f"moepack's side {missing}")

    res = {"date": utc_now(),
           "commit": git_commit(), "hardware": hw, "cpu_simd_flags": cpu_simd_flags(),
           "cpu": cpu, "load_avg_start": os.getloadavg(), "repeat": a.repeat,
           "variants": variants, "ram_mib": a.ram_mib, "moepack_ram_mib": a.ram_mib,
           "sweeps": a.sweeps,
           "shapes": a.shapes.split(","), "types": a.types.split(","), "ggml": ggml,
           "moepack_missing": missing or None, "read_gbs": [], "runs": [], "name": a.name}
    for rnd in range(a.repeat):
        engines = [("llama.cpp", v) for v in variants] + [("moepack", "")] * have_moepack
        if rnd % 2:
            engines.reverse()
        for eng, v in engines:
            log(f"round {rnd + 1}/{a.repeat}: {eng} {v}")
            if eng == "moepack":
                try:
                    recs = run_moepack(cpu, a.ram_mib)
                except RuntimeError as e:  # keep llama.cpp's figures; say why moepack has none
                    log(str(e))
                    res["moepack_missing"] = str(e)
                    have_moepack = False
                    continue
            else:
                recs = run_ggml(v, cpu, a.types, a.shapes, a.ram_mib, a.sweeps)
                head = next((r for r in recs if "compiled_for" in r), {})
                ggml[v].update(version=head.get("ggml_version"),
                               compiled_for=head.get("compiled_for"))
            for r in recs:
                r["round"] = rnd
                if "read_gbs_best" in r:
                    res["read_gbs"].append(r["read_gbs_best"])
            res["runs"] += [r for r in recs if "codec" in r]
    res["load_avg_end"] = os.getloadavg()
    res["summary"] = summarise(res["runs"])
    ratios(res["summary"], variants)
    md = markdown(res)
    print(md)
    if not a.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(res, indent=1) + "\n")
        write_benchmarks_md(md, a.name)
        log(f"wrote {results.relative_to(ROOT)} and BENCHMARKS.md (section {a.name})")


if __name__ == "__main__":
    main()
