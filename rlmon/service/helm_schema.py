"""The Helm chart's schema for its ``config`` value, generated from the service's settings model.

The chart writes ``config`` into the pod's rlmon config file; a misspelt key or a wrong type there
used to pass ``helm install`` and crash-loop the pod on ``rlmon serve``'s first line. The schema of
:class:`~rlmon.service.config.Settings` (pydantic's JSON Schema) now sits under
``properties.config`` of ``helm/rlmon/values.schema.json``, its definitions under the file's
``$defs``, so Helm rejects the value before anything is deployed; the rest of the file stays
hand-written. Secrets are refused there as the config loader refuses them: the chart passes them
from Kubernetes Secrets (its ``secrets`` value).
"""

from __future__ import annotations

import json
from typing import Any

from rlmon.service.artifact import Artifact
from rlmon.service.config import Settings

__all__ = ["SCHEMA_PATH", "artifacts", "config_schema"]

SCHEMA_PATH = "helm/rlmon/values.schema.json"

# settings model -> the fields that hold a secret (env or a file only, never the config file)
_SECRET_FIELDS = {"SlackConfig": ("webhook_url",), "PagerDutyConfig": ("routing_key",),
                  "WebhookConfig": ("url", "token"), "ExporterConfig": ("token",)}
_NO_SECRET = {"not": {}, "description": "a secret is never written in the config: set the "
              "chart's secrets.* value (a Kubernetes Secret) instead"}


def _untitled(node: Any) -> Any:
    """pydantic's schema without its generated titles (the field names say the same)."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the schema of ``config``, the definitions it refers to as ``#/$defs/...``)."""
    schema = _untitled(Settings.model_json_schema())
    defs = schema.pop("$defs")
    for model, fields in _SECRET_FIELDS.items():
        for field in fields:
            defs[model]["properties"][field] = dict(_NO_SECRET)
    schema["description"] = ("rlmon config file (YAML), checked against rlmon's settings model "
                             "(generated: rlmon generate); secrets are rejected")
    return schema, defs


def _render() -> str:
    schema, defs = config_schema()
    return json.dumps({"config": schema, "$defs": defs})


def _splice(current: str, generated: str) -> str:
    doc, part = json.loads(current), json.loads(generated)
    doc["properties"]["config"] = part["config"]
    doc["$defs"] = part["$defs"]
    return json.dumps(doc, indent=2) + "\n"


def artifacts() -> list[Artifact]:
    return [Artifact(SCHEMA_PATH, _render, splice=_splice)]
