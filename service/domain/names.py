"""The syntax of the names learners and their cluster objects carry: DNS labels (host
names, Service names), label keys and label values, as Kubernetes checks them.

Pure rules, one owner: the catalog validates an operator's node labels with them, the
launchers derive learner host names with them, the Kubernetes objects their labels. A
value that does not fit is made to fit stably (the same input, the same output) and
without collisions (a hash of the original is appended), never silently truncated alone.
"""

from __future__ import annotations

import hashlib
import re

DNS_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
# A DNS subdomain (a label key's optional prefix, most object names): 253 at most.
DNS_SUBDOMAIN_MAX = 253

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_HASH_CHARS = 8


def is_dns_label(value: str) -> bool:
    """RFC 1123 label: what a host name, a pod's hostname or subdomain may be."""
    return len(value) <= DNS_LABEL_MAX and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    """RFC 1123 subdomain: what most object names (a Secret's) may be."""
    return len(value) <= DNS_SUBDOMAIN_MAX and bool(_DNS_SUBDOMAIN.match(value))


def is_label_value(value: str) -> bool:
    """A label value: empty, or up to 63 alphanumerics, '-', '_', '.' (alphanumeric ends)."""
    return value == "" or (len(value) <= LABEL_VALUE_MAX and bool(_LABEL_NAME.match(value)))


def is_label_key(key: str) -> bool:
    """A label key (also a node-selector or toleration key): `[prefix/]name`, the prefix a
    DNS subdomain, the name as a label value but not empty."""
    prefix, _, name = key.rpartition("/")
    if prefix and not is_dns_subdomain(prefix):
        return False
    if "/" in key and not prefix:
        return False
    return name != "" and is_label_value(name)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:_HASH_CHARS]


def dns_label(value: str, max_length: int = DNS_LABEL_MAX) -> str:
    """`value` as a DNS label of at most `max_length` characters: itself where it is one;
    else lowercased, other characters as '-', cut, and a hash of `value` appended."""
    if len(value) <= max_length and is_dns_label(value):
        return value
    if max_length <= _HASH_CHARS + 1:
        raise ValueError(f"a DNS label of {max_length} characters cannot carry a hash")
    body = re.sub(r"[^a-z0-9-]+", "-", value.lower())
    body = body[: max_length - _HASH_CHARS - 1].strip("-")
    return f"{body}-{_digest(value)}" if body else _digest(value)


def label_value(value: str) -> str:
    """`value` as a label value: itself where it is one; else its allowed characters, cut,
    and a hash of `value` appended."""
    if is_label_value(value):
        return value
    body = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)
    body = body[: LABEL_VALUE_MAX - _HASH_CHARS - 1]
    body = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", body)
    return f"{body}-{_digest(value)}" if body else _digest(value)
