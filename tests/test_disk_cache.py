"""The disk cache's storage layer (runtime/disk_cache.py) and region keys on disk
(runtime/region_store.py), without a compiler: entries, damage, eviction, two writers,
permissions, and keys that are the same in every process."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from adaptive_eager import config
from adaptive_eager.runtime import disk_cache
from adaptive_eager.runtime.disk_cache import DiskCache, resolve_dir
from adaptive_eager.runtime.region_store import RegionStore, open_store, stable_text


def _cache(tmp_path, **kw) -> DiskCache:
    return DiskCache(str(tmp_path / "c"), **kw)


def test_round_trip_and_miss(tmp_path):
    c = _cache(tmp_path)
    assert c.get("k") is None
    assert c.put("k", b"\x00payload\xff")
    assert c.get("k") == b"\x00payload\xff"
    assert c.put("k", b"replaced") and c.get("k") == b"replaced"
    assert (c.hits, c.stored) == (2, 2)
    info = c.info()
    assert info.entries == 1 and info.usable and info.bytes > len(b"replaced")


def test_folder_created_owner_only(tmp_path):
    c = _cache(tmp_path)
    c.put("k", b"x")
    assert os.stat(c.path).st_mode & 0o777 == 0o700
    assert os.stat(c.entry_path("k")).st_mode & 0o077 == 0


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "other format", "empty"])
def test_damaged_entries_are_skipped_deleted_and_replaced(tmp_path, damage):
    c = _cache(tmp_path)
    c.put("k", b"0123456789" * 10)
    path = c.entry_path("k")
    blob = open(path, "rb").read()
    if damage == "flipped byte":
        blob = blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]
    elif damage == "truncated":
        blob = blob[:-7]
    elif damage == "other format":
        blob = b"AEDC\x00" + blob[5:]
    else:
        blob = b""
    open(path, "wb").write(blob)
    assert c.get("k") is None
    assert c.damaged == 1 and not os.path.exists(path)
    assert c.put("k", b"fresh") and c.get("k") == b"fresh"


def test_full_cache_evicts_least_recently_used(tmp_path):
    c = _cache(tmp_path, max_bytes=3 * 1100)
    for i, k in enumerate("abc"):
        c.put(k, bytes(1000))
        os.utime(c.entry_path(k), (1000 + i, 1000 + i))  # a before b before c
    assert c.get("a") is not None  # a used last now: b is the least recently used
    c.put("d", bytes(1000))
    assert [k for k in "abcd" if os.path.exists(c.entry_path(k))] == ["a", "c", "d"]
    assert c.info().bytes <= c.max_bytes
    assert not c.put("huge", bytes(4000))  # larger than the bound: not stored at all
    assert c.clear() == 3 and c.info().entries == 0


_WRITER = textwrap.dedent("""
    import sys
    from adaptive_eager.runtime.disk_cache import DiskCache
    c = DiskCache(sys.argv[1])
    me = sys.argv[2].encode()
    seen = set()
    for i in range(300):
        c.put("shared", me * 5000)
        got = c.get("shared")
        if got is not None:
            assert got in (b"A" * 5000, b"B" * 5000), got[:20]
            seen.add(got[:1])
    print("ok", sorted(seen), c.damaged)
""")


def test_two_processes_racing_on_one_entry(tmp_path):
    path = str(tmp_path / "c")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, who], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for who in "AB"]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.startswith("ok") and out.strip().endswith(" 0"), out  # never a damaged read
    c = DiskCache(path)
    assert c.get("shared") in (b"A" * 5000, b"B" * 5000)
    assert [n for n in os.listdir(path) if n.startswith(".tmp-")] == []


def test_folder_writable_by_others_is_refused_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "c"
    folder.mkdir()
    os.chmod(folder, 0o777)
    c = DiskCache(str(folder))
    with caplog.at_level(logging.WARNING, logger="adaptive_eager"):
        assert not c.put("k", b"x")
        assert c.get("k") is None and c.get("k") is None
    warnings = [r for r in caplog.records if "not using the compiled-region cache" in r.getMessage()]
    assert len(warnings) == 1 and str(folder) in warnings[0].getMessage()
    assert "writable by other users" in warnings[0].getMessage()
    assert not c.info().usable and os.listdir(folder) == []


def test_entry_writable_by_others_or_a_symlink_is_refused(tmp_path, caplog):
    c = _cache(tmp_path)
    c.put("k", b"x")
    os.chmod(c.entry_path("k"), 0o666)
    with caplog.at_level(logging.WARNING, logger="adaptive_eager"):
        assert c.get("k") is None
    assert c.entry_path("k") in caplog.text
    c2 = DiskCache(str(tmp_path / "c2"))
    c2.put("j", b"y")
    target = tmp_path / "elsewhere.bin"
    os.replace(c2.entry_path("j"), target)
    os.symlink(target, c2.entry_path("j"))
    assert c2.get("j") is None and not c2.info().usable


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another user")
def test_entry_owned_by_another_user_is_refused(tmp_path):
    c = _cache(tmp_path)
    c.put("k", b"x")
    os.chown(c.entry_path("k"), 12345, 12345)
    assert c.get("k") is None and "owned by uid 12345" in c.info().problem


def test_cache_off_and_default_location(monkeypatch, tmp_path):
    for off in ("", "off", "OFF", " none "):
        assert resolve_dir(off) is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_dir("auto") == str(tmp_path / "xdg" / "adaptive_eager")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert resolve_dir("auto") == os.path.join(os.path.expanduser("~"), ".cache", "adaptive_eager")
    monkeypatch.setenv("ADAPTIVE_EAGER_CACHE_DIR", "off")
    assert open_store(config.resolve(backend="inductor")) is None
    monkeypatch.setenv("ADAPTIVE_EAGER_CACHE_DIR", str(tmp_path / "on"))
    assert open_store(config.resolve(backend="inductor")) is not None
    # eager and aot_eager make nothing that can be saved: no disk cache for them
    assert open_store(config.resolve(backend="eager")) is None
    assert open_store(config.resolve(backend="aot_eager")) is None
    assert not (tmp_path / "on").exists()  # nothing is created until a region asks


def test_one_cache_object_per_folder(tmp_path):
    assert disk_cache.open_cache(str(tmp_path)) is disk_cache.open_cache(str(tmp_path) + "/")


_KEY_SCRIPT = textwrap.dedent("""
    import torch
    from adaptive_eager.fusion.signature import region_key, window_key
    from adaptive_eager.fusion.ir import OpNode, TensorSpec, ValueRef, Window
    from adaptive_eager.runtime.disk_cache import DiskCache
    from adaptive_eager.runtime.region_store import RegionStore
    aten = torch.ops.aten
    x = torch.ones(8, 4); s = TensorSpec.of(x)
    w = Window({0: x}, (OpNode(aten.mul.Tensor, (ValueRef(0), -0.0), (), (1,)),
                        OpNode(aten.sum.dim_IntList, (ValueRef(1), [1], True), (), (2,))),
               {0: s, 1: s, 2: TensorSpec((8, 1), (1, 1), 0, torch.float32, torch.device("cpu"))},
               frozenset({2}))
    k = region_key(w, (0, 1), (0,), (2,), {0: 0})
    print(RegionStore(DiskCache("/nonexistent"), "inductor", "cpu", None).key(k, 2))
""")


def test_region_keys_are_the_same_in_every_process():
    keys = set()
    for seed in ("1", "2"):  # another string hashing per process
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        keys.add(out.stdout.strip())
    assert len(keys) == 1 and len(keys.pop()) == 64


def test_keys_tell_apart_what_shapes_an_artifact():
    from adaptive_eager.fusion.signature import Key

    store = RegionStore(DiskCache("/nonexistent"), "inductor", "cpu", None)
    aten = torch.ops.aten
    k = Key(((aten.mul.Tensor, ("v", 0), (float, 2.0)),))
    assert store.key(k, 1) != store.key(k, 2)  # threads baked into CPU kernels
    assert store.key(k, 1) != RegionStore(store.cache, "inductor", "neuron", None).key(k, 1)
    assert store.key(k, 1) != store.key(Key(((aten.mul.Tensor, ("v", 0), (float, 3.0)),)), 1)
    assert store.key(k, 1) != store.key(Key(((aten.mul.Tensor, ("v", 0), (float, b"\x80" + bytes(7))),)), 1)
    assert stable_text((1, True)) != stable_text((True, 1))
    assert stable_text([1]) != stable_text((1,))
    # something without a stable spelling: not cached on disk rather than keyed wrongly
    assert store.key(Key((object(),)), 1) is None


def test_vector_isa_verdict_is_recorded_only_when_every_isa_passed(tmp_path):
    # Note [The vector ISA probe is remembered]: a later store (process) reads the record
    def store():
        return RegionStore(DiskCache(str(tmp_path / "c")), "inductor", "cpu", None)

    s = store()
    assert not s.isa_ok()
    s.note_isa(None)   # told, not probed: nothing learned
    s.note_isa(False)  # some ISA failed its probe: keep probing
    assert not store().isa_ok()
    s.note_isa(True)
    assert s.isa_ok() and store().isa_ok()


def test_only_the_vector_isa_inductor_picks_is_probed(monkeypatch):
    # Note [Only the picked vector ISA is probed] (compile_worker.py): one probe build,
    # of the first ISA the CPU's flags allow, not one per allowed ISA.
    import platform

    from torch._inductor import config as inductor_config
    from torch._inductor import cpu_vec_isa

    from adaptive_eager.runtime.compile_worker import probe_picked_isa

    probed = []

    class FakeISA:
        def __init__(self, name, ok):
            self.name, self.ok = name, ok

        def __str__(self):
            return self.name

        def __bool__(self):
            probed.append(self.name)
            return self.ok

    isas = [FakeISA("amx_tile", True), FakeISA("avx512", True), FakeISA("avx2", True)]
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", isas)
    monkeypatch.setattr(cpu_vec_isa, "x86_isa_checker", lambda: ["avx512", "avx2"])
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    with inductor_config.patch({"cpp.vec_isa_ok": None, "cpp.simdlen": None}):
        assert probe_picked_isa() is True
        assert probed == ["avx512"]  # amx_tile not allowed by the flags; avx2 never built
        isas[1].ok = False
        assert probe_picked_isa() is False  # Inductor then probes them all, as before
        probed.clear()
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the user's choice: Inductor's pick
        assert probe_picked_isa() is None and probed == []
        monkeypatch.delenv("ATEN_CPU_CAPABILITY")
        with inductor_config.patch({"cpp.simdlen": 256}):
            assert probe_picked_isa() is None and probed == []
