"""Named components of transformers models, usable wherever a layer goes: one vocabulary of names
(``embed``, ``blocks.3.resid_post``, ``blocks.3.attn.z``, one head ``blocks.3.attn.head.5.z``,
``final_norm``, ``unembed``) resolved for each supported family from the table in ``_families``
(``_table``), read and written through ``_views``' :class:`View`, checked by ``_check`` on one
short pass, remembered per model by ``_memo``, and hooked as layers through ``_sites``'
:class:`ComponentSite`, which ``selection`` hands out for a component name.

Stands on ``core`` and ``errors`` and below ``selection``, so that capture, edit and every
``layers=`` take the names. Must not import: ``selection``, capture, edit, grads, records,
analysis, ``anatomy``, ``loading``, ``viz``, ``report``, ``cli``.
"""

from ._families import FAMILIES, Family, Site, family_of_type, heads_of
from ._memo import remembered, resolved
from ._sites import HEAD_PARTS, ComponentSite, check_writable, component_sites, is_component_name
from ._table import BLOCK_NAMES, READ_ONLY, Component, Components, resolve
from ._views import View, first_argument

__all__ = ["FAMILIES", "Family", "Site", "family_of_type", "heads_of", "remembered", "resolved", "HEAD_PARTS",
           "ComponentSite", "check_writable", "component_sites", "is_component_name", "BLOCK_NAMES", "READ_ONLY",
           "Component", "Components", "resolve", "View", "first_argument"]
