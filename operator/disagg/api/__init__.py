"""The DisaggregatedModel API: pydantic models (the one definition) and CRD generation."""

from .models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ActiveMode,
    DisaggregatedModel,
    DisaggregatedModelSpec,
    DisaggregatedModelStatus,
    Mode,
    spec_errors,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ActiveMode",
    "DisaggregatedModel",
    "DisaggregatedModelSpec",
    "DisaggregatedModelStatus",
    "Mode",
    "spec_errors",
]
