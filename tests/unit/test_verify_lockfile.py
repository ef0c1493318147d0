import pytest
from test_verify_fakes import content_hash, rehash_text

from envspec.verify import cli
from envspec.verify.lockfile import DEFAULT_LOCK, LockReadError, find_lock, load_lock, lock_hash

GOOD = """version = 1
revision = 3
[meta]
name = "x"
content_hash = "sha256:%s"
[platform]
venv = "/opt/venv"
[hardware]
arch_list = []
[[wheels]]
name = "torch"
version = "2.14.1"
""" % ("0" * 64)
GOOD = rehash_text(GOOD)  # the hash of its tables, as `envspec lock` writes it


def test_find_lock_order(monkeypatch, tmp_path):
    monkeypatch.delenv("ENVSPEC_LOCK", raising=False)
    assert find_lock(None) == (type(tmp_path)(DEFAULT_LOCK), "default image path")
    monkeypatch.setenv("ENVSPEC_LOCK", str(tmp_path / "env.lock"))
    assert find_lock(None)[1] == "ENVSPEC_LOCK"
    assert find_lock(tmp_path / "a.lock") == (tmp_path / "a.lock", "--lock")


def test_load_good_lock_and_hash(tmp_path):
    p = tmp_path / "a.lock"
    p.write_text(GOOD)
    lock = load_lock(p)
    assert lock["revision"] == 3  # additive revisions are read
    assert lock_hash(lock) == content_hash(lock) != "sha256:" + "0" * 64


def test_a_table_the_verifier_reads_that_is_not_a_table_is_absent(tmp_path):
    p = tmp_path / "a.lock"
    p.write_text(rehash_text(GOOD.replace("[meta]", 'torch = "2.14.1"\nruntime = 3\n[meta]')))
    lock = load_lock(p)
    assert "torch" not in lock and "runtime" not in lock
    assert lock["platform"] == {"venv": "/opt/venv"} and lock["wheels"][0]["name"] == "torch"


def test_a_lock_edited_by_hand_is_refused(tmp_path):
    """issue 43, 1: the verifier, as envspec's own reader, refuses a lock whose tables no longer give
    its content hash; the start-up hook, which reads a few tables only, does not hash."""
    p = tmp_path / "a.lock"
    p.write_text(GOOD.replace('version = "2.14.1"', 'version = "2.14.2"'))
    with pytest.raises(LockReadError, match="lock-tampered"):
        load_lock(p)
    assert load_lock(p, tables=("meta", "platform", "hardware"))["meta"]["name"] == "x"


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "version = 2\n[platform]\n[hardware]\n",
            "lock format version 2 is not one this verifier reads",
        ),
        ("version = 1\n[platform\n", "not valid TOML"),
        ("version = 1\n", "[platform] is missing; [hardware] is missing"),
        (
            "version = 1\n[platform]\n[hardware]\n[[wheels]]\nname = 'x'\n",
            "wheels[0].version is missing",
        ),
    ],
)
def test_bad_locks_say_what_is_wrong(tmp_path, text, words):
    p = tmp_path / "bad.lock"
    p.write_text(text)
    with pytest.raises(LockReadError) as e:
        load_lock(p)
    assert words in e.value.message


def test_cli_exit_2_on_missing_lock(tmp_path, capsys):
    rc = cli.main(["--lock", str(tmp_path / "nope.lock")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no lockfile at" in err and "--lock" in err and "hint:" in err


def test_cli_accepts_leading_verify_word(tmp_path, capsys):
    assert cli.main(["verify", "--lock", str(tmp_path / "nope.lock")]) == 2


def test_launcher_only_knows_verify(capsys):
    assert cli.launcher(["build"]) == 2
    assert "envspec verify" in capsys.readouterr().err


def test_startup_off_does_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVSPEC_VERIFY", "off")
    assert cli.startup_check(None, lock_path=str(tmp_path / "nope.lock")) == 0


def test_startup_missing_lock_warn_vs_strict(tmp_path, capsys):
    assert cli.startup_check("warn", lock_path=str(tmp_path / "nope.lock")) == 0
    assert cli.startup_check("strict", lock_path=str(tmp_path / "nope.lock")) == 2
    assert "no lockfile" in capsys.readouterr().err
