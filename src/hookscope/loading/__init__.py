"""Models as hookscope's command line names them, for Python: ``load_model("torchvision:resnet18")``.

:func:`load_model` builds or reads the model a spec names (the bundled ``tiny`` and ``demo``,
``torchvision:NAME``, ``hf:CLASS_OR_TASK``, ``timm:NAME``, ``package.module:ATTR``, ``file.py:ATTR``,
a ``model.pt``), with its weights; :func:`load_weights` fits a weights file onto a built model;
:func:`class_names` says the class names that go with them.

Security: a spec naming Python code imports and runs it; every file is read with
``torch.load(weights_only=True)``, which runs no code, and pickled objects only with
``trust_pickle=True``. Every error is a one-line :class:`~hookscope.errors.LoadError`
(:class:`~hookscope.errors.UntrustedPickleError` for a pickle refused).

One job a module: ``spec`` (what a spec names), ``usercode`` (running the caller's code), ``files``
(reading files without unpickling), ``weights`` (fitting a state_dict), ``vision``, ``hf`` /
``hf_weights``, ``timm_models`` (the libraries' builders), ``extras`` (their imports), ``classes``
(class names), ``images``, ``inputs`` and ``tokens`` (a model's inputs: :func:`load_images` by the model
library's own transform, :func:`example_input`, :func:`tokenize`), ``origin`` (where a model's weights came from: :func:`weights_origin`), ``preprocessing`` (what a model's files say about its input), ``voice`` (the words of
the messages: Python's or the command line's), ``model`` (``load_model`` itself).
Must not import: ``cli``, ``viz``, ``report``, any analysis (``weights`` and ``pretrained`` fit a
model to a compacted weights file through ``anatomy``).

Example:
    >>> import torch, hookscope
    >>> model = hookscope.load_model("demo")
    >>> model(torch.zeros(1, 3, 64, 64)).shape, hookscope.class_names("demo")[:2]
    (torch.Size([1, 6]), ['circle', 'square'])
"""

from .classes import class_names, read_class_names
from .images import ImageTransform, Images, image_files, image_transform, load_images, read_image
from .inputs import example_input, model_shape
from .model import check_seed, load_model
from .origin import WeightsOrigin, weights_origin
from .spec import Spec, parse_spec, usual_shape
from .tokens import Tokens, load_tokenizer, tokenize
from .weights import load_weights

__all__ = ["ImageTransform", "Images", "Spec", "Tokens", "WeightsOrigin", "check_seed", "class_names",
           "example_input", "image_files", "image_transform", "load_images", "load_model", "load_tokenizer",
           "load_weights", "model_shape", "parse_spec", "read_class_names", "read_image", "tokenize", "usual_shape",
           "weights_origin"]
