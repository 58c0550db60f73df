"""Input protections of a passive party's own images: every plug-in registered by importing this
package."""

from passive_party.protections import antigan  # noqa: F401  (registers its protection)
from passive_party.protections.base import (
    PROTECTIONS,
    Protected,
    Protection,
    ProtectionParams,
    build_protection,
)

__all__ = ["PROTECTIONS", "Protected", "Protection", "ProtectionParams", "build_protection"]
