from envspec import errors


def test_exit_codes_are_distinct_and_documented():
    codes = {
        errors.EXIT_OK,
        errors.EXIT_CHECK_FAILED,
        errors.EXIT_BAD_INPUT,
        errors.EXIT_SOURCE,
        errors.EXIT_BUILD,
        errors.EXIT_HOST,
        errors.EXIT_INTERRUPTED,
    }
    assert len(codes) == 7
    doc = errors.__doc__
    for code in codes:
        assert f" {code} " in doc or f"{code}  " in doc, code


def test_each_error_class_has_a_kebab_reference_and_a_known_code():
    known = {
        errors.EXIT_CHECK_FAILED,
        errors.EXIT_BAD_INPUT,
        errors.EXIT_SOURCE,
        errors.EXIT_BUILD,
        errors.EXIT_HOST,
    }
    refs = set()
    for cls in errors.ALL_ERRORS:
        assert cls.exit_code in known, cls
        assert cls.reference == cls.reference.lower() and " " not in cls.reference
        refs.add(cls.reference)
    assert len(refs) == len(errors.ALL_ERRORS)


def test_build_error_carries_the_command_and_stderr_tail():
    e = errors.BuildError(
        "commit failed",
        step="commit",
        argv=["buildah", "commit", "x"],
        returncode=125,
        stderr_tail="line1\nboom",
    )
    assert "buildah commit x" in e.message and "125" in e.message and "boom" in e.message
    assert e.exit_code == errors.EXIT_BUILD
