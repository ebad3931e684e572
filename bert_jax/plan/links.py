"""The links a collective crosses and their bandwidths, read from the data sheets' table in links.toml.

A TPU slice's chips talk over ICI, slices over the data-center network (DCN); a GPU node's cards over NVLink, nodes
over the network between them (one adapter per GPU on an HGX node). Each chip or card has a table in links.toml
with the figure one device sends at in one direction and where it comes from: a new chip or card is a new table,
not a new branch here.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import tomllib

from bert_jax.plan import gpu_cards
from bert_jax.plan.roofline import LinkTime


@dataclasses.dataclass(frozen=True)
class Link:
    name: str  # ICI, DCN, NVLink, network
    bytes_per_s: float  # what one device sends per second over it, one direction
    source: str  # the data sheet


@dataclasses.dataclass(frozen=True)
class Links:
    """The link within a slice or node, and the one between them (None: no data-sheet figure)."""

    within: Link
    between: Link | None
    between_name: str  # the link between slices or nodes, named even without a figure


def _table() -> dict:
    text = importlib.resources.files("bert_jax.plan").joinpath("links.toml").read_text()
    return tomllib.loads(text)


def links_of(key: str, is_gpu: bool) -> Links:
    """The links of a TPU generation (v5e) or GPU card (h100), as links.toml has them; fails naming the table."""
    table = _table().get(key)
    if table is None or "within" not in table:
        raise KeyError(f"bert_jax/plan/links.toml has no [{key}.within] table: add the chip's links there")

    def link(entry: dict) -> Link:
        return Link(entry["link"], float(entry["bytes_per_s"]), entry["source"])
    between = table.get("between")
    return Links(link(table["within"]), link(between) if between else None,
                 between["link"] if between else ("network" if is_gpu else "DCN"))


def links_for(accelerator) -> Links:
    """The links of a TPU slice (bert_jax/parallel/tpu_slices.py) or a GPU set (bert_jax/plan/gpu_cards.py)."""
    chip = accelerator.chip
    if isinstance(chip, gpu_cards.GpuCard):
        return links_of(chip.key, is_gpu=True)
    return links_of(chip.generation, is_gpu=False)


def link_times(found, links: Links) -> tuple:
    """The collective model: each link's bytes per device per step (bert_jax/plan/collectives.py) over its
    bandwidth, asynchronous and synchronous apart (bert_jax/plan/roofline.py adds them to the bound so). A link
    without a data-sheet figure gets no term (its bytes are still listed)."""
    times = []
    for link, part in ((links.within, "within_bytes"), (links.between, "between_bytes")):
        if link is None:
            continue
        overlapped = sum(getattr(c, part) for c in found if c.asynchronous) / link.bytes_per_s
        serial = sum(getattr(c, part) for c in found if not c.asynchronous) / link.bytes_per_s
        if overlapped or serial:
            times.append(LinkTime(link.name, overlapped, serial))
    return tuple(times)
