"""The registry stage as a build is given it (``envspec.image.BuildOptions.registry``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from envspec.image.engine import Engine, RegistryAccess
from envspec.image.sbom import make_sbom
from envspec.plan import BuildPlan
from envspec.registry.attest import SigningKey, att_tag, attach, repository, sig_tag, sign
from envspec.registry.client import RegistryClient
from envspec.registry.regcache import RegistryCache
from envspec.registry.verify_image import RegistryReader

__all__ = ["Registry"]


@dataclass(frozen=True)
class Registry:
    """The registry side of one build: ``key`` signs the pushed image and its attestations (and an
    image index), ``lock_path`` is the lock's path as the provenance names it."""

    key: SigningKey | None = None
    lock_path: str = ""

    @property
    def signs(self) -> bool:
        return self.key is not None

    def attach(
        self, push: Callable[[Path, str], None], work: Path, plan: BuildPlan, digest: str, dest: str
    ) -> tuple[tuple[str, str], ...]:
        """Push the attestations of the image ``digest`` pushed as ``dest`` and, with a key, its
        signature (``attest.attach``); (reference, manifest digest) of each, in push order."""
        return attach(
            push, work, plan, digest, dest, make_sbom(plan), self.key, lock_path=self.lock_path
        ).pushed()

    def sign(
        self, push: Callable[[Path, str], None], work: Path, digest: str, dest: str
    ) -> tuple[str, str]:
        """Push the signature of the manifest ``digest`` (an image index's) pushed as ``dest``."""
        assert self.key is not None
        return sign(push, work, digest, dest, self.key)

    def refs(self, dest: str, digest: str) -> list[tuple[str, str]]:
        """What ``attach`` pushes for ``digest`` pushed as ``dest``: ("attestations", ref) and, with
        a key, ("signature", ref); for a dry run."""
        repo = repository(dest)
        out = [("attestations", f"{repo}:{att_tag(digest)}")]
        if self.key is not None:
            out.append(("signature", f"{repo}:{sig_tag(digest)}"))
        return out

    def layer_cache(self, engine: Engine, cache_from: str, cache_to: str) -> RegistryCache:
        """The registries ``cache_from``/``cache_to``, read and written with the engine's registry
        access (credentials, TLS) and its push."""
        access = getattr(engine, "registry", None) or RegistryAccess()
        return RegistryCache(
            cache_from, cache_to, RegistryReader(access), engine.push, client=RegistryClient(access)
        )
