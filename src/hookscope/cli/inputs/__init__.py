"""What the command line reads as a model's input: image files and folders (``_images``), data for
``extract`` (``_data``), ``--input`` shapes (``_shapes``), ``--text`` through a tokenizer
(``_tokenizer``), and the one input a command runs its model on (``_inputs``). Each turns strings
into calls of ``hookscope.loading``'s public functions."""

from ._data import ArrayFiles, FileData, ImageFiles, file_data, kind_of
from ._images import (IMAGE_SUFFIXES, PRESETS, ImageTransform, add_image_arguments, image_files, load_images,
                      preset_for, read_image, size_hint)
from ._inputs import ModelInput, hf_logits, model_input
from ._shapes import check_fits, example_input, parse_shape
from ._tokenizer import hf_tokenizer, text_tokens, tokenizer_files

__all__ = ["ArrayFiles", "FileData", "ImageFiles", "file_data", "kind_of", "IMAGE_SUFFIXES", "PRESETS",
           "ImageTransform", "add_image_arguments", "image_files", "load_images", "preset_for", "read_image",
           "size_hint", "ModelInput", "hf_logits", "model_input", "check_fits", "example_input", "parse_shape",
           "hf_tokenizer", "text_tokens", "tokenizer_files"]
