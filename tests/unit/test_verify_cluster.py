"""`envspec cluster render`: golden files (regenerate with ENVSPEC_REGEN_GOLDEN=1 and review)."""

import os
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
from envspec.verify import cluster  # noqa: E402

GOLDEN = Path(__file__).parent.parent / "data" / "verify" / "golden"
IMAGE = "ghcr.io/acme/envspec/h100-train@sha256:" + "0123456789abcdef" * 4
CASES = {
    "slurm.sbatch": dict(kind="slurm", nnodes=4, gpus_per_node=8, partition="gpu"),
    "kubernetes.yaml": dict(kind="kubernetes", nnodes=4, gpus_per_node=8, namespace="ml"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name):
    kw = dict(CASES[name])
    text = cluster.render(kw.pop("kind"), image=IMAGE, **kw)
    path = GOLDEN / name
    if os.environ.get("ENVSPEC_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_enroot_reference():
    assert cluster.enroot_ref("ghcr.io/a/b", "sha256:x") == "ghcr.io#a/b@sha256:x"
    assert cluster.enroot_ref("localhost:5000/b", "sha256:x") == "localhost:5000#b@sha256:x"
    assert cluster.enroot_ref("library/b", "sha256:x") == "library/b@sha256:x"


@pytest.mark.parametrize("image", ["ghcr.io/a/b:latest", "ghcr.io/a/b@sha256:abc", "b"])
def test_image_must_be_pinned_by_digest(image):
    with pytest.raises(cluster.RenderError, match="not pinned by digest"):
        cluster.render("slurm", image=image, nnodes=2, gpus_per_node=8)


def test_cli_main(capsys, tmp_path):
    out = tmp_path / "job.yaml"
    assert cluster.main(["render", "--kubernetes", "--image", IMAGE, "--nnodes", "2", "--gpus-per-node", "8",
                         "-o", str(out)]) == 0
    assert "completionMode: Indexed" in out.read_text()
    assert cluster.main(["--slurm", "--image", "x:1", "--nnodes", "2", "--gpus-per-node", "8"]) == 2
    assert "not pinned by digest" in capsys.readouterr().err


def test_templates_use_strict_undefined(tmp_path, monkeypatch):
    (tmp_path / "slurm.sbatch.j2").write_text("{{ nope }}\n")
    monkeypatch.setattr(cluster, "TEMPLATES", tmp_path)
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        cluster.render("slurm", image=IMAGE, nnodes=1, gpus_per_node=1)
