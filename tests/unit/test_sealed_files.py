"""Sealed files (edgebench.files): the models edgebench generates are read-only, and the local device's cache
and the store share a sealed file's bytes by hard link (checked by inode and link count, and by hashlib on the
bytes) while a file its owner may still write is copied, so rewriting it never reaches a measured copy."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from edgebench.files import is_sealed, link_sealed, seal
from edgebench.models.refs import resolve_model
from edgebench.results.models import ModelStore
from edgebench.transports.local import LocalTransport


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def writable_by_nobody(path: Path) -> bool:
    return not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


@pytest.mark.parametrize(
    "ref",
    ["builtin:tinymlp", "builtin:mlp.tflite", "builtin:decoder:layers=1,hidden=32,heads=2,vocab=64,ffn=64",
     "builtin:llama:layers=1,hidden=256,ffn=768,heads=4,kv_heads=2,vocab=512,dtype=q8_0",
     "builtin:kernel:gelu,s=8,d=16"],
)  # fmt: skip
def test_generated_models_are_sealed(ref: str) -> None:
    model = resolve_model(ref)
    assert writable_by_nobody(model.path), oct(model.path.stat().st_mode)


def test_local_push_links_a_sealed_file_and_copies_a_writable_one(tmp_path: Path) -> None:
    sealed, mine = tmp_path / "sealed.bin", tmp_path / "mine.bin"
    sealed.write_bytes(os.urandom(1 << 16))
    mine.write_bytes(os.urandom(1 << 16))
    seal(sealed)
    local = LocalTransport()
    local.push(sealed, str(tmp_path / "cache" / "a.bin"), timeout=30)
    local.push(mine, str(tmp_path / "cache" / "b.bin"), timeout=30)
    a, b = tmp_path / "cache" / "a.bin", tmp_path / "cache" / "b.bin"
    assert a.stat().st_ino == sealed.stat().st_ino and sealed.stat().st_nlink == 2
    assert b.stat().st_ino != mine.stat().st_ino and mine.stat().st_nlink == 1
    assert (sha(a), sha(b)) == (sha(sealed), sha(mine))
    before = sha(b)
    with open(mine, "r+b") as fh:  # the owner rewrites their file in place
        fh.write(b"\0" * 16)
    assert sha(b) == before
    assert sorted((tmp_path / "cache").iterdir()) == [a, b]  # no temporary file left


def test_the_store_links_a_sealed_model_and_seals_a_copied_one(tmp_path: Path) -> None:
    sealed, mine = tmp_path / "sealed.onnx", tmp_path / "mine.onnx"
    sealed.write_bytes(os.urandom(1 << 16))
    mine.write_bytes(os.urandom(1 << 16))
    seal(sealed)
    store = ModelStore(tmp_path / "s.db.models")
    kept_sealed, kept_mine = store.keep(sealed), store.keep(mine)
    assert kept_sealed.sha256 == sha(sealed) and kept_mine.sha256 == sha(mine)
    assert kept_sealed.path is not None and kept_mine.path is not None
    assert kept_sealed.path.stat().st_ino == sealed.stat().st_ino
    assert kept_mine.path.stat().st_ino != mine.stat().st_ino and is_sealed(kept_mine.path)
    assert sha(kept_mine.path) == sha(mine)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".part-")]


def test_a_sealed_file_replaced_by_rename_leaves_its_links_intact(tmp_path: Path) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"old" * 1000)
    seal(source)
    linked = tmp_path / "linked.gguf"
    assert link_sealed(source, linked)
    fresh = tmp_path / ".m.gguf.new"
    fresh.write_bytes(b"new" * 1000)
    os.replace(fresh, source)  # how edgebench rewrites a generated model: a new file renamed over the name
    assert linked.read_bytes() == b"old" * 1000


def test_no_link_across_file_systems_or_to_a_writable_file(tmp_path: Path) -> None:
    mine = tmp_path / "mine.bin"
    mine.write_bytes(b"x" * 100)
    assert not link_sealed(mine, tmp_path / "l1") and not (tmp_path / "l1").exists()
    seal(mine)
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == mine.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) to link across; the writable case above ran")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        assert not link_sealed(mine, Path(other) / "l2")  # EXDEV: the caller copies
        local = LocalTransport()
        local.push(mine, str(Path(other) / "pushed"), timeout=30)
        assert (Path(other) / "pushed").read_bytes() == b"x" * 100


@pytest.mark.parametrize("runtime", ["mnn", "ncnn"])
def test_converted_models_in_the_cache_are_sealed(runtime: str) -> None:
    from edgebench.jobs import ncnn_weights_of
    from edgebench.probes.common import model_file_for

    converted = model_file_for(resolve_model("builtin:tinymlp"), runtime)
    files = [converted, ncnn_weights_of(converted)] if runtime == "ncnn" else [converted]
    assert all(writable_by_nobody(f) for f in files), [oct(f.stat().st_mode) for f in files]
