"""The settings every stream worker shares: how much it reads, how long it waits, when it takes over a dead
consumer's entries and how it backs off while the bus is down (the loop itself: :mod:`meridian.bus.consumer`).

A consumer's settings hold one :class:`ConsumerSettings` as their ``bus`` field, with that component's own
defaults (:meth:`ConsumerSettings.tailored`), so a partial override (one environment variable) keeps the
rest of them::

    MERIDIAN_DISPATCH_BUS__BLOCK_MS=50 MERIDIAN_DISPATCH_BUS__BACKOFF_S='[0.1, 0.5]'

Flat spellings (``MERIDIAN_DISPATCH_BLOCK_MS``, or ``block_ms=`` given to the settings class) are also
read, so deployments that set them keep working, through :class:`StreamConsumerSettings`; the nested
spelling wins where both are given. A producer, which only backs off, types its delays :data:`BackoffDelays`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

BackoffDelays = Annotated[tuple[Annotated[float, Field(ge=0)], ...], Field(min_length=1)]
"""Delays (s) between retries while the bus cannot be reached; the last repeats (:func:`backoff_delay`)."""


class ConsumerSettings(BaseModel):
    """How a stream worker reads its consumer group. The defaults are the regional dispatch worker's."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(256, ge=1, description="Entries read (and claimed) per poll; a batch is acknowledged "
                       "together. Larger batches amortise the round trip; 256 small entries are a few tens of KB.")
    block_ms: int = Field(200, ge=0, description="Longest a read waits for new entries (ms): how soon a worker "
                          "sees its stop signal, and how often an idle worker polls. 0: a read returns at once "
                          "(tests step a worker by hand; a running worker would then poll without pause).")
    claim_idle_ms: int = Field(30_000, ge=0, description="Entries another consumer read and has not acknowledged "
                               "for this long belong to a dead consumer and are claimed (XAUTOCLAIM). Must exceed "
                               "the longest a live consumer holds a batch, or two apply the same entries; 30 s is "
                               "far above one batch.")
    backoff_s: BackoffDelays = Field((0.2, 0.5, 1.0, 2.0, 5.0), description="Delays (s) between retries while the "
                                     "bus cannot be reached; the last repeats. Short first, so a blip costs little, "
                                     "and at most 5 s, so a fleet does not hammer a recovering Redis.")

    @classmethod
    def tailored(cls, name: str, *, at_least: Mapping[str, int] | None = None,
                 **defaults: Any) -> type[ConsumerSettings]:
        """A subclass named ``name`` whose fields default to ``defaults`` (a component's own; descriptions and
        bounds kept), with the stricter lower bounds ``at_least``: given one field of it, the others stay
        that component's defaults."""
        fields: dict[str, Any] = {}
        for key in {**defaults, **(at_least or {})}:
            if key not in cls.model_fields:
                raise TypeError(f"{name}: {key!r} is not a field of {cls.__name__}")
            info = cls.model_fields[key]
            metadata = [*info.metadata]
            if at_least and key in at_least:
                metadata.append(annotated_types.Ge(at_least[key]))
            fields[key] = (Annotated[(info.annotation, *metadata)],
                           Field(defaults.get(key, info.default), description=info.description))
        model = create_model(name, __base__=cls, __module__=cls.__module__, **fields)
        model.model_validate(model().model_dump())  # defaults outside their bounds fail here, at import
        return model


class _FlatNamesEnv(EnvSettingsSource):
    """The flat environment spellings of :attr:`StreamConsumerSettings.flat_bus_names`, read as plain keys
    (``MERIDIAN_DISPATCH_BLOCK_MS`` as ``block_ms``) for the model validator to move under ``bus``."""

    def __init__(self, settings_cls: type[BaseSettings], names: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.names = names

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for old in self.names:
            key = f"{self.env_prefix}{old}"
            value = self.env_vars.get(key if self.case_sensitive else key.lower())
            if value is None:
                continue
            try:
                found[old] = json.loads(value) if value.lstrip().startswith("[") else value
            except ValueError:
                found[old] = value  # validation says what is wrong with it
        return found


class StreamConsumerSettings(BaseSettings):
    """Base of a stream consumer's settings: subclasses declare ``bus`` (a :meth:`ConsumerSettings.tailored`
    type) and ``flat_bus_names`` (flat name → field of ``bus``), accepted as keyword arguments and as
    ``<env_prefix><FLAT_NAME>`` variables."""

    model_config = SettingsConfigDict(env_nested_delimiter="__")

    flat_bus_names: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _fold_flat_bus_names(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(old in data for old in cls.flat_bus_names):
            return data
        data = dict(data)
        given = data.get("bus")
        if isinstance(given, BaseModel):
            given = given.model_dump(exclude_unset=True)
        nested = dict(given) if isinstance(given, Mapping) else {}
        for old, new in cls.flat_bus_names.items():
            if old in data:
                nested.setdefault(new, data.pop(old))
        data["bus"] = nested
        return data

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FlatNamesEnv(settings_cls, cls.flat_bus_names), dotenv_settings,
                file_secret_settings)
