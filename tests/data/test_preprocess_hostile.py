"""Hostile input to `astrai preprocess`: what a user may hand it must end in a kept dataset
or a one-line error, never a traceback, a deleted input or a leaked temporary directory."""

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest

from astrai.config.preprocess import load_spec
from astrai.data.builder import build_dataset
from astrai.data.dataset import open_dataset
from astrai.data.records import iter_lines, load_json
from astrai.errors import ConfigError, DataError

LONG = "The quality of mercy is not strained; it droppeth as the gentle rain. " * 2


def _rows(out):
    return len(open_dataset(out))



@pytest.mark.parametrize("fmt", ["h5", "bin"])
def test_overwrite_refuses_a_dataset_holding_files_it_does_not_own(spec_for, tmp_path,
                                                                    write_jsonl, fmt):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG + str(i)} for i in range(4)])
    out = tmp_path / "ds"
    build_dataset(spec_for("pretrain", [f], output=str(out), format=fmt))
    # a dataset astrai wrote, as it is, is replaced: everything in it is listed
    build_dataset(spec_for("pretrain", [f], output=str(out), format=fmt, overwrite=True))
    for foreign in (out / "thesis.tex", out / "train" / "notes.txt", out / "tokenizer" / "x",
                    out / ".ssh" / "id_ed25519"):
        foreign.parent.mkdir(parents=True, exist_ok=True)
        foreign.write_text("keep")
        rel = foreign.relative_to(out).parts[0] if ".ssh" in foreign.parts else (
            foreign.relative_to(out).as_posix())  # a foreign directory is named, not its files
        with pytest.raises(ConfigError, match=f"holds {rel}, which the dataset does not own"):
            build_dataset(spec_for("pretrain", [f], output=str(out), format=fmt,
                                   overwrite=True))
        assert foreign.read_text() == "keep"
        foreign.unlink()
        if foreign.parent.name == ".ssh":
            foreign.parent.rmdir()
    (out / "train" / "link").symlink_to(f)  # a symlink is never the dataset's
    with pytest.raises(ConfigError, match="holds train/link"):
        build_dataset(spec_for("pretrain", [f], output=str(out), format=fmt, overwrite=True))

def test_bom_at_file_start_is_not_part_of_the_first_record(spec_for, tmp_path):
    f = tmp_path / "in.jsonl"
    body = b"".join(json.dumps({"text": LONG + str(i)}).encode() + b"\n" for i in range(3))
    f.write_bytes(b"\xef\xbb\xbf" + body)
    res = build_dataset(spec_for("pretrain", [f], packing={"mode": "none"}))
    st = res.splits["train"]
    assert (st.records_read, st.records_kept, st.malformed) == (3, 3, 0)
    assert [n for n, _ in iter_lines(f)] == [1, 2, 3]
    assert json.loads(next(iter_lines(f))[1])["text"] == LONG + "0"


def test_invalid_utf8_is_one_bad_record_under_skip(spec_for, tmp_path):
    f = tmp_path / "in.jsonl"
    good = json.dumps({"text": LONG}).encode() + b"\n"
    f.write_bytes(good + b'{"text": "\xff\xfe"}\n' + good)
    res = build_dataset(spec_for("pretrain", [f], packing={"mode": "none"}), on_error="skip")
    st = res.splits["train"]
    assert (st.records_read, st.records_kept, st.malformed) == (3, 2, 1)
    assert any("in.jsonl:2: not valid UTF-8" in e for e in res.errors)


@pytest.mark.parametrize("line,match", [
    ('{"text": "' + LONG + '\\ud800"}', r"in.jsonl:2: holds a lone surrogate \(\\ud800\)"),
    ("[" * 100_000 + "]" * 100_000, "in.jsonl:2: invalid JSON .nested too deeply"),
])
def test_unencodable_and_deep_records_skip_or_one_line(spec_for, tmp_path, write_jsonl,
                                                        line, match):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}, line, {"text": LONG + "!"}])
    spec = spec_for("pretrain", [f], packing={"mode": "none"})
    with pytest.raises(DataError, match=match) as e:
        build_dataset(spec)
    assert "\n" not in str(e.value)
    res = build_dataset(spec, on_error="skip")
    st = res.splits["train"]
    assert (st.records_read, st.records_kept, st.malformed) == (3, 2, 1)
    assert _rows(tmp_path / "out") == 2


@pytest.mark.parametrize("text,expected", [
    ('{"a": "x', "Unterminated string starting at column 7"),
    ('{"a": "x\ny"}', "Invalid control character at column 9"),
    ("{bad", "Expecting property name enclosed in double quotes at column 2"),
])
def test_json_error_wording(text, expected):
    with pytest.raises(DataError) as e:
        load_json(text, "f:1")
    assert str(e.value) == f"f:1: invalid JSON ({expected})"


def test_overwrite_replaces_only_an_astrai_dataset_without_inputs(spec_for, tmp_path,
                                                                  write_jsonl):
    d = tmp_path / "d"
    d.mkdir()
    f = write_jsonl(d / "in.jsonl", [{"text": LONG}])
    # a directory that is not a dataset, holding the spec's own input: refused, kept
    with pytest.raises(ConfigError, match="not an astrai dataset"):
        build_dataset(spec_for("pretrain", [f], output=str(d), overwrite=True))
    assert f.is_file()
    # a dataset that holds an input (a user put it there): refused, kept
    build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "ds")))
    inside = write_jsonl(tmp_path / "ds" / "more.jsonl", [{"text": LONG}])
    with pytest.raises(ConfigError, match="holds the input"):
        build_dataset(spec_for("pretrain", [inside], output=str(tmp_path / "ds"),
                               overwrite=True))
    assert inside.is_file()
    inside.unlink()
    # a dataset astrai wrote: replaced
    build_dataset(spec_for("pretrain", [f, f], output=str(tmp_path / "ds"), overwrite=True,
                           packing={"mode": "none"}))
    assert _rows(tmp_path / "ds") == 1  # duplicates are read once
    # a plain file named as output is never replaced
    (tmp_path / "file").write_text("keep")
    with pytest.raises(ConfigError, match="not an astrai dataset"):
        build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "file"), overwrite=True))
    assert (tmp_path / "file").read_text() == "keep"


def test_unwritable_output_is_one_line(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"output: cannot create .*afile/sub"):
        build_dataset(spec_for("pretrain", [f], output=str(tmp_path / "afile" / "sub")))


def test_unwritable_directory_is_one_line(spec_for, tmp_path, write_jsonl, monkeypatch):
    # root ignores directory permissions, so the refusal of the kernel is simulated
    from astrai import tempdir

    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    real = tempdir.Path.mkdir

    def readonly(self, *a, **kw):
        if self.name.startswith(".out.tmp-"):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(tempdir.Path, "mkdir", readonly)
    with pytest.raises(ConfigError, match="output: cannot create .*Permission denied"):
        build_dataset(spec_for("pretrain", [f]))


def test_abandoned_temp_dirs_are_removed_live_ones_kept(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    dead = tmp_path / ".out.tmp-999999-deadbeef"  # a killed run's: nobody holds its lock
    dead.mkdir()
    (dead / "train").mkdir()
    live = tmp_path / ".out.tmp-1-cafecafe"  # a running writer's: its lock is held
    live.mkdir()
    other = tmp_path / ".other.tmp-1-00000000"  # another output's: not ours to judge
    other.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        build_dataset(spec_for("pretrain", [f]))
    finally:
        os.close(fd)
    assert not dead.exists() and live.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == [live.name]


def test_outputs_follow_the_umask(spec_for, tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    old = os.umask(0o022)
    try:
        build_dataset(spec_for("pretrain", [f]))
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "manifest.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("key,value", [("max_seq_len", True), ("max_records", False),
                                       ("filters", {"min_chars": True})])
def test_booleans_are_not_numbers(tok, tmp_path, key, value):
    data = {"kind": "pretrain", "inputs": ["x.jsonl"], "tokenizer": str(tok.path),
            "output": str(tmp_path / "out"), key: value}
    with pytest.raises(ConfigError, match="expected a number, got (true|false)"):
        load_spec(data=data)


def test_globs_and_directories_do_not_enter_symlinked_directories(tmp_path):
    """A link to another tree inside the inputs is not walked: `**` and directory inputs
    see the real tree only (a link to `/` walked the whole filesystem)."""
    from astrai.data.records import expand_inputs

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_text('{"text": "a"}\n')
    (data / "sub" / "b.jsonl").write_text('{"text": "b"}\n')
    (data / ".hidden.jsonl").write_text('{"text": "h"}\n')
    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    (elsewhere / "c.jsonl").write_text('{"text": "c"}\n')
    (data / "link").symlink_to(tmp_path / "elsewhere")
    want = [data / "a.jsonl", data / "sub" / "b.jsonl"]
    assert expand_inputs([str(data / "**" / "*.jsonl")]) == want
    assert expand_inputs([str(data)], dir_suffixes=(".jsonl",)) == [data / ".hidden.jsonl",
                                                                     *want]
    assert expand_inputs([str(data / "*.jsonl")]) == [data / "a.jsonl"]
    assert expand_inputs([str(data / ".*.jsonl")]) == [data / ".hidden.jsonl"]
    # a link named on purpose is still read
    assert expand_inputs([str(data / "link" / "deep" / "*.jsonl")]) == [
        data / "link" / "deep" / "c.jsonl"]


GLOB_SCRIPT = """
import sys
from astrai.data.records import expand_inputs
print("\\n".join(str(p) for p in expand_inputs([sys.argv[1]], "inputs")))
"""


def test_a_recursive_glob_through_link_loops_ends(tmp_path):
    """Links back to the top would make `glob.glob` walk 3^40 paths: bounded in a child."""
    import subprocess
    import sys

    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "a" / "x.jsonl").write_text('{"text": "a"}\n')
    for i in range(3):
        (data / "a" / f"loop{i}").symlink_to(data)
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", GLOB_SCRIPT, str(data / "**" / "*.jsonl")],
                       capture_output=True, text=True, timeout=30, check=False,
                       env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(data / "a" / "x.jsonl")]
