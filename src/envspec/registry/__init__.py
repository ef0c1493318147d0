"""The registry stage: what a pushed image carries beside it (``attest``: provenance and SBOM
attestations, signatures), the registry as a layer cache (``regcache``), and the check of a pushed
image in its registry (``verify_image``).

``stage.Registry`` is what a build is given for it (``envspec.image.BuildOptions.registry``, the shape
``envspec.image.RegistrySide``): the image stage pushes through its engine and calls this stage
for what goes beside the push and for the layer cache; it imports nothing of this package.
"""
