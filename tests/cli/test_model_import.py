"""`spolake model import`: what it refuses, in one line, before loading anything."""
import pytest

from spo_lake.models.importing import GGUF_MAGIC, resolve_gguf


@pytest.mark.parametrize("args, message", [
    (["--from-gguf", "missing.gguf"], "error: --from-gguf missing.gguf: no such file"),
    (["--from-gguf", "notgguf.bin"], "error: --from-gguf notgguf.bin: not a GGUF file"),
    (["--from-gguf", "."], "error: --from-gguf .: no such file (a directory: use --from-dir)"),
    ([], "error: give exactly one of --from-gguf FILE|NAME and --from-dir DIR"),
    (["--from-gguf", "x.gguf", "--from-dir", "."], "error: give exactly one of"),
    (["--from-dir", "."], "has no config.json"),
])
def test_import_refuses_bad_sources_in_one_line(spolake, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notgguf.bin").write_bytes(b"PK\x03\x04 not a gguf file")
    result = spolake("model", "import", *args, "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_file_with_the_gguf_magic_is_accepted_as_a_source(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(GGUF_MAGIC + b"\x03\x00\x00\x00")
    assert resolve_gguf(str(path)) == path.resolve()
