"""``ringseed mount``'s timeouts: which driver gets which (no FUSE needed)."""

from __future__ import annotations

import pytest

from ringseed.fs import mount_command


def test_the_staleness_period_reaches_the_fusepy_driver_under_data_only() -> None:
    assert mount_command._fusepy_timeout("data", attr_timeout=None, list_ttl=60.0) == 60.0
    assert mount_command._fusepy_timeout("data/imagenet", attr_timeout=5.0, list_ttl=60.0) == 5.0
    assert mount_command._fusepy_timeout("data", attr_timeout=None, list_ttl=None) is None


def test_a_staleness_period_outside_data_is_refused_naming_the_root() -> None:
    with pytest.raises(ValueError, match=r"--list-ttl applies to dataset mounts.*'ckpt'"):
        mount_command._fusepy_timeout("ckpt", attr_timeout=None, list_ttl=60.0)


def test_the_sidecar_flag_parses_and_a_bad_one_is_an_argument_error() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    mount_command.configure(parser)
    assert parser.parse_args(["/m", "--root", "data", "--list-ttl", "60"]).list_ttl == 60.0
    with pytest.raises(SystemExit):
        parser.parse_args(["/m", "--list-ttl", "-1"])
