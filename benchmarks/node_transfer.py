"""The node programs' throughput beside the machine's own limit (issue 24, "measured, not
assumed"): what scripts/asset_store.py and s3_store.py move and verify per second, against
`sha256sum` and `cat` of the same files in parallel, one process per file. launcher/cost/estimate.py
cites the figures recorded in docs/benchmarks.md ("Node programs: bytes and hashes").

    python3 benchmarks/node_transfer.py [--files 8] [--mib 128] [--s3-mib 64] [--rows-convs 20000]
        [--work DIR] [--json OUT]

Measured, each on the same files (written first, so every reader reads the page cache: this is
the CPU and memory side of the node, not a disk's):
- limit sha256sum: `sha256sum FILE` for every file at once (the hash's limit on these cores);
- limit openssl: `openssl dgst -sha256 FILE` at once (OpenSSL's hash, which hashlib uses);
- limit cat: `cat FILE > /dev/null` for every file at once (reading), `cat SRC > DEST`
  (copying) and `cat SRC > DEST && sync DEST` (copying durably, as a fetch does);
- hash: asset_store.hash_files (what resolve and verify do), one thread per file;
- fetch dir: asset_store.fetch from a directory store (parallel preads, hashed as they arrive,
  written to a fresh cache directory);
- push dir: asset_store.push into a directory store (hashed as read, copied);
- fetch s3 / raw s3: asset_store.fetch from a loopback moto S3 server (ranged GETs through boto3),
  and the same ranged GETs with no hashing and no writing (the loopback server's own limit);
  needs boto3 and moto (skipped with a note when absent);
- rows build: scripts/build_sft_rows.py with its whitespace test tokenizer on generated
  conversations (the pipeline around the tokenizer: the real tokenizer is not timed here).

Standard library (+ boto3/moto for the S3 part, pyarrow/numpy for the rows build).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import asset_store  # noqa: E402 (scripts/ on the path above)
import store_base  # noqa: E402

MiB = 1 << 20
ASSET = {"kind": "hf-snapshot", "repo": "bench/m", "repo_type": "model", "revision": "0" * 40}
ASSET["include"] = None


def quiet(_: str) -> None:
    pass


def write_files(root: Path, n: int, mib: int) -> list[str]:
    block = os.urandom(4 * MiB)
    names = []
    for i in range(n):
        name = f"model-{i:05d}.safetensors"
        with open(root / name, "wb") as f:
            for j in range(mib // 4):
                f.write(hashlib.sha256(f"{i}/{j}".encode()).digest() + block[32:])
        names.append(name)
    return names


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def parallel_shell(cmds: list[list[str]]) -> float:
    def go() -> None:
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL) for c in cmds]
        for p in procs:
            assert p.wait() == 0

    return timed(go)


def row(name: str, nbytes: int, seconds: float, note: str = "") -> dict[str, Any]:
    return {"what": name, "bytes": nbytes, "s": round(seconds, 3),
            "GBps": round(nbytes / seconds / 1e9, 3), "note": note}  # fmt: skip


def bench_files(work: Path, files: int, mib: int) -> list[dict[str, Any]]:
    src = work / "src"
    src.mkdir()
    names = write_files(src, files, mib)
    total = files * mib * MiB
    paths = [str(src / n) for n in names]
    out = []
    out.append(row("limit sha256sum", total, parallel_shell([["sha256sum", p] for p in paths])))
    if shutil.which("openssl"):
        out.append(
            row("limit openssl sha256", total,
                parallel_shell([["openssl", "dgst", "-sha256", p] for p in paths]))
        )  # fmt: skip
    out.append(row("limit cat (read)", total, parallel_shell([["cat", p] for p in paths])))
    cp = work / "cp"
    cp.mkdir()
    out.append(
        row("limit cat (copy)", total,
            parallel_shell([["sh", "-c", f'cat "$0" > "{cp}/$(basename "$0")"', p] for p in paths]))
    )  # fmt: skip
    shutil.rmtree(cp)
    cp.mkdir()
    out.append(
        row("limit cat (copy) + sync FILE", total,
            parallel_shell([["sh", "-c", f'd="{cp}/$(basename "$0")"; cat "$0" > "$d" && sync "$d"',
                             p] for p in paths]),
            "the copy made durable, as a fetch is before its rename")
    )  # fmt: skip
    shutil.rmtree(cp)
    out.append(
        row("hash (asset_store.hash_files)", total,
            timed(lambda: asset_store.hash_files(src, names, threads=files)))
    )  # fmt: skip
    manifest = asset_store.make_manifest(src, ASSET, threads=files)
    store = asset_store.open_store(str(work / "store"))
    out.append(
        row("push dir (hash as read + copy)", total,
            timed(lambda: asset_store.push(store, "k", src, manifest, threads=files, log=quiet)))
    )  # fmt: skip
    dest = work / "cache"
    out.append(
        row("fetch dir (ranged preads, hash as they arrive, write)", total,
            timed(lambda: asset_store.fetch(store, "k", dest, ASSET, threads=files, log=quiet)),
            f"{store_base.RANGES} ranges of {store_base.RANGE_BYTES // MiB} MiB in flight per file")
    )  # fmt: skip
    assert asset_store.verify_tree(dest, manifest, threads=files) == []
    shutil.rmtree(dest)
    shutil.rmtree(work / "store")
    shutil.rmtree(src)
    return out


def bench_s3(work: Path, files: int, mib: int) -> list[dict[str, Any]]:
    try:
        import boto3
        import moto  # noqa: F401 (the server runs in its own process below)
        from botocore.config import Config
    except ImportError as err:
        return [{"what": "s3", "note": f"skipped: {err}"}]
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from moto.server import main; sys.exit(main())",
         "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update({
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
        "REPRODUCE_S3_CLIENT": "boto3",
    })  # fmt: skip
    try:
        client = boto3.client("s3", config=Config(max_pool_connections=128))
        client.create_bucket(Bucket="bench")
        src = work / "s3src"
        src.mkdir()
        names = write_files(src, files, mib)
        total = files * mib * MiB
        manifest = asset_store.make_manifest(src, ASSET, threads=files)
        store = asset_store.open_store("s3://bench/store")
        push_s = timed(
            lambda: asset_store.push(store, "k", src, manifest, threads=files, log=quiet)
        )
        dest = work / "s3cache"
        fetch_s = timed(
            lambda: asset_store.fetch(store, "k", dest, ASSET, threads=files, log=quiet)
        )
        assert asset_store.verify_tree(dest, manifest, threads=files) == []
        rb, size = store_base.RANGE_BYTES, mib * MiB

        def raw() -> None:
            def one(name: str) -> None:
                spans = [(o, min(rb, size - o)) for o in range(0, size, rb)]
                with ThreadPoolExecutor(store_base.RANGES) as pool:
                    list(pool.map(lambda s: client.get_object(
                        Bucket="bench", Key=f"store/k/{name}",
                        Range=f"bytes={s[0]}-{s[0] + s[1] - 1}")["Body"].read(), spans))  # fmt: skip

            with ThreadPoolExecutor(files) as pool:
                list(pool.map(one, names))

        raw_s = timed(raw)
        shutil.rmtree(dest)
        shutil.rmtree(src)
        note = "loopback moto (a Python server, its own process): its rate, not S3's"
        return [
            row("push s3 (moto)", total, push_s, note),
            row("fetch s3 (moto): ranged GETs, hash as they arrive, write", total, fetch_s, note),
            row("raw s3 (moto): the same ranged GETs, bytes dropped", total, raw_s, note),
        ]
    finally:
        server.terminate()
        server.wait()


def bench_rows(work: Path, convs: int) -> list[dict[str, Any]]:
    try:
        import numpy  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as err:
        return [{"what": "rows build", "note": f"skipped: {err}"}]
    rng = random.Random(7)
    words = [f"w{i}" for i in range(5000)]
    source = work / "convs.jsonl"
    with open(source, "w") as f:
        for _ in range(convs):
            msgs = [
                {"role": r, "content": " ".join(rng.choices(words, k=rng.randint(20, 400)))}
                for r in ("user", "assistant", "user", "assistant")
            ]
            f.write(json.dumps({"messages": msgs}) + "\n")
    out = work / "rows.parquet"
    cmd = [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--source", str(source),
           "--tokenizer", "builtin:whitespace-test", "--row-tokens", "8192", "--out", str(out)]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    s = time.perf_counter() - t
    report = json.loads(proc.stdout)
    tokens = int(report["rows"]) * 8192
    return [{"what": "rows build (whitespace test tokenizer)", "rows": report["rows"],
             "tokens": tokens, "s": round(s, 3), "tokens_per_s": round(tokens / s),
             "bytes": out.stat().st_size,
             "note": f"{convs} generated conversations, one process"}]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--s3-mib", type=int, default=64)
    p.add_argument("--rows-convs", type=int, default=20000)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="node-transfer-", dir=a.work))
    try:
        results = bench_files(work, a.files, a.mib)
        results += bench_s3(work, a.files, a.s3_mib)
        results += bench_rows(work, a.rows_convs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = {
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "machine": platform.machine(), "kernel": platform.release(),
        "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "files": a.files, "mib": a.mib,
    }  # fmt: skip
    doc = {"machine": machine, "results": results}
    print(json.dumps(machine))
    for r in results:
        rate = f"{r['GBps']:>7.3f} GB/s" if "GBps" in r else ""
        if "tokens_per_s" in r:
            rate = f"{r['tokens_per_s']:>9} tokens/s"
        print(f"{r['what']:<60} {rate:>18}  {r.get('s', '')} s  {r.get('note', '')}")
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
