"""The store: activations (or any named tensors) on disk as safetensors shards plus a JSON manifest.

Writing happens on a background thread from reused buffers (:class:`StoreWriter`); every file appears under
its final name only when complete, so a killed run leaves complete shards and tmp leftovers
(:func:`remove_partial`), never a half-written shard. Each shard carries the crc32 of its data in its header,
so a shard damaged afterwards is found (:func:`complete_shards` refuses it, :func:`remove_damaged` removes it). :func:`open_store` reads a store lazily, memory-mapped,
and refuses one whose files do not match its manifest. Any safetensors reader opens the shards.

This package imports only torch, numpy and the standard library (and hookscope's errors and result protocol).
"""

from ._files import (SCHEMA_VERSION, ShardInfo, clear_store, complete_shards, count_complete, is_store, read_manifest,
                     remove_damaged, remove_partial, shard_numbers, shard_path, write_json)
from ._format import storable
from ._lock import LOCK_NAME, locked
from ._reader import LayerArray, Store, open_store
from ._tensors import load_tensors, save_tensors, weights_hash
from ._writer import ArraySpec, ShardBuffer, StoreWriter

__all__ = [
    "SCHEMA_VERSION", "ArraySpec", "ShardInfo", "ShardBuffer", "StoreWriter", "shard_path", "complete_shards",
    "count_complete", "shard_numbers", "remove_damaged", "remove_partial", "write_json", "read_manifest", "is_store", "clear_store", "weights_hash", "save_tensors",
    "load_tensors", "open_store", "Store", "LayerArray", "storable", "locked", "LOCK_NAME",
]
