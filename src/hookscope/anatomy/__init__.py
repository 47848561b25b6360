"""What hookscope knows of a model family's layers: where an attention layer keeps its heads
(``_heads``, one reader per kind, and the compacted layers' own forwards ``_heads_mha``,
``_heads_swin``, ``_heads_maxvit``), the hidden width of a transformer (``_width``), the MLP width a
config says (``_mlp``), a model fitted to a smaller, compacted state_dict (``_resize``), and one
vocabulary of component names across transformers families (``_components``: ``components`` and
``component``, over ``hookscope.named``, which holds the table, the views, the check and the memo
below ``selection`` so that the names work as layers; its names are handed on here).

A floor below both ``analysis.prune`` (which removes heads, channels and width) and ``loading``
(which loads a compacted model's weights back): the knowledge they share. Must not import: analysis,
``loading``, ``capture``, ``cli``, ``viz``, ``report``.
"""

from ._components import BLOCK_NAMES, Component, Components, component, components
from ._heads import (READERS, HeadLayout, Part, config_heads, fix_layout, heads_of, holds_head_tables, out_site,
                     read_layout, refit_heads, write_head_configs)
from ._heads_fit import head_misfit
from ._heads_mha import HeadPrunedMultiheadAttention, attend
from ._mlp import write_mlp_configs
from ._resize import (RESIZABLE, fit_to, fix_sizes, is_compacted, marked_compacted, shrinks)
from ..named import FAMILIES, ComponentSite, Family, Site, View, first_argument
from ._width import (TOKENS, embed_scales, is_layer_norm, is_rms_norm, module_widths, refit_width, rescale_norm,
                     write_layer_norm_configs, write_width_configs)

__all__ = ["HeadLayout", "Part", "READERS", "config_heads", "fix_layout", "heads_of", "holds_head_tables", "out_site",
           "read_layout", "refit_heads", "write_head_configs", "head_misfit", "HeadPrunedMultiheadAttention", "attend",
           "write_mlp_configs", "RESIZABLE", "fit_to", "fix_sizes", "is_compacted", "marked_compacted", "shrinks",
           "TOKENS", "embed_scales", "is_layer_norm", "is_rms_norm", "module_widths", "refit_width", "rescale_norm",
           "write_layer_norm_configs", "write_width_configs", "BLOCK_NAMES", "Component", "Components", "component",
           "components", "FAMILIES", "Family", "Site", "View", "first_argument", "ComponentSite"]
