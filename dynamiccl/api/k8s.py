"""Small Kubernetes shapes our custom resources embed (label selectors, conditions, refs).

Field names follow Kubernetes' camelCase on the wire; Python code uses snake_case
(``validate_by_name``). No Kubernetes client import here: these are plain models.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# Bounds that keep CEL cost estimates inside the apiserver's budget.
MAX_NAME = 253
MAX_LABEL_VALUE = 63
MAX_MESSAGE = 1024
MAX_SELECTOR_TERMS = 16

LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]


class CamelModel(BaseModel):
    """Base for CR shapes: camelCase aliases, unknown fields rejected, immutable."""

    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class SelectorOperator(StrEnum):
    """Operators of a label selector requirement."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(CamelModel):
    """One `matchExpressions` term."""

    model_config: ClassVar[ConfigDict] = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['In', 'NotIn'] ? size(self.values) > 0"
                    " : !has(self.values) || size(self.values) == 0",
                    "message": "values must be non-empty for In/NotIn and empty for"
                    " Exists/DoesNotExist",
                }
            ]
        }
    )

    key: LabelKey
    operator: SelectorOperator
    values: Annotated[list[LabelValue], Field(max_length=64)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_match_operator(self) -> Self:
        needs = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if needs != bool(self.values):
            raise ValueError(
                "values must be non-empty for In/NotIn and empty for Exists/DoesNotExist"
            )
        return self


class LabelSelector(CamelModel):
    """A Kubernetes label selector; an empty selector matches everything."""

    match_labels: Annotated[dict[str, LabelValue], Field(max_length=MAX_SELECTOR_TERMS)] = Field(
        default_factory=dict
    )
    match_expressions: Annotated[
        list[LabelSelectorRequirement], Field(max_length=MAX_SELECTOR_TERMS)
    ] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes selector semantics over a label map."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator is SelectorOperator.IN:
                ok = present and labels[req.key] in req.values
            elif req.operator is SelectorOperator.NOT_IN:
                ok = not present or labels[req.key] not in req.values
            elif req.operator is SelectorOperator.EXISTS:
                ok = present
            else:
                ok = not present
            if not ok:
                return False
        return True

    @property
    def specificity(self) -> int:
        """Number of terms: a more specific selector wins a tie (see policy_match)."""
        return len(self.match_labels) + len(self.match_expressions)


class ConditionStatus(StrEnum):
    """Condition truth value."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(CamelModel):
    """A `metav1.Condition`."""

    type: Annotated[str, Field(min_length=1, max_length=316, pattern=r"^[A-Za-z][A-Za-z0-9]*$")]
    status: ConditionStatus
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: Annotated[str, Field(max_length=64)] = ""
    observed_generation: Annotated[int, Field(ge=0)] = 0


Conditions = Annotated[
    list[Condition],
    Field(
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    ),
]


class ObjectRef(CamelModel):
    """The object a TuningRun belongs to."""

    api_version: Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
    kind: Annotated[str, Field(min_length=1, max_length=63)]
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
    uid: Annotated[str, Field(max_length=64)] = ""


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of the same type; keep its transition time if status is unchanged."""
    out: list[Condition] = []
    replaced = False
    for cond in conditions:
        if cond.type == new.type:
            replaced = True
            if cond.status == new.status and cond.last_transition_time:
                new = new.model_copy(update={"last_transition_time": cond.last_transition_time})
            out.append(new)
        else:
            out.append(cond)
    if not replaced:
        out.append(new)
    return out


def dump(model: BaseModel) -> dict[str, Any]:
    """The wire form of a CR model: camelCase, JSON types, no unset optionals."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
