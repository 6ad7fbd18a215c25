"""Kubernetes' name syntax (service.domain.names), table-tested: what is valid, and what an
invalid value is made into (valid, stable, distinct from another's)."""

from __future__ import annotations

import pytest

from service.domain.names import (
    dns_label,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    label_value,
)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("learner-abc123", True),
        ("a", True),
        ("0abc", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("Learner", False),
        ("-a", False),
        ("a-", False),
        ("a.b", False),
        ("", False),
    ],
)
def test_dns_labels(value: str, valid: bool) -> None:
    assert is_dns_label(value) is valid


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("regcred", True),
        ("registry.example.com", True),
        ("a" * 63 + "." + "b" * 63, True),
        ("a." * 126 + "bb", False),
        ("Reg", False),
        ("a..b", False),
        (".a", False),
        ("", False),
    ],
)
def test_dns_subdomains(value: str, valid: bool) -> None:
    assert is_dns_subdomain(value) is valid


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("", True),
        ("Tesla-P100-PCIE-16GB", True),
        ("a_b.c-d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("_a", False),
        ("a.", False),
        ("a b", False),
        ("a/b", False),
    ],
)
def test_label_values(value: str, valid: bool) -> None:
    assert is_label_value(value) is valid


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("pool", True),
        ("nvidia.com/gpu.product", True),
        ("kubernetes.io/hostname", True),
        ("dlaas.io/training-id", True),
        ("Example.com/x", False),  # the prefix is a DNS subdomain: lowercase
        ("example.com/", False),
        ("/x", False),
        ("a/b/c", False),
        ("", False),
        ("x" * 64, False),
        ("a" * 254 + "/x", False),
    ],
)
def test_label_keys(key: str, valid: bool) -> None:
    assert is_label_key(key) is valid


@pytest.mark.parametrize(
    "value", ["abc", "ABC_def", "x" * 200, "---", "tenant.name.", "Ünïcode", "a b/c"]
)
def test_made_to_fit_stably_and_distinctly(value: str) -> None:
    for make, check, longest in ((dns_label, is_dns_label, 63), (label_value, is_label_value, 63)):
        made = make(value)
        assert check(made) and 0 < len(made) <= longest
        assert make(value) == made
        assert make(value + "!") != made
        if check(value):
            assert made == value


def test_a_shorter_dns_label_on_request() -> None:
    made = dns_label("learner-" + "y" * 80, 57)
    assert len(made) <= 57 and made.startswith("learner-yyy") and is_dns_label(made)
    with pytest.raises(ValueError, match="cannot carry a hash"):
        dns_label("Not valid", 9)
