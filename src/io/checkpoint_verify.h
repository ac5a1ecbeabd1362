#pragma once
// The deep check of a checkpoint directory: what `gpt2-ckpt verify` reports, and what consolidate
// and export-hf require before they read one. Format: docs/DESIGN.md "Checkpoint layout as built".
#include <string>
#include <vector>

#include "src/io/manifest.h"

namespace gpt2 {

// Every problem of the checkpoint, one line each naming the file ("" never appears); empty = good.
// Checks: each file's size and CRC-32C; the manifest's own consistency (params inside
// [0, flat_total) without overlaps, model.* keys, shard files listed); the shards cover
// [0, flat_padded) without gaps or overlaps; each shard's HDF5 datasets of its moment format
// (type and length from its range; 8-bit scales finite and non-negative) and attributes
// begin/end; and, for checkpoints of older versions that list a model.h5, that it holds every
// parameter with the manifest's shape. Never throws for a damaged file: that is a problem line.
std::vector<std::string> verify_checkpoint(const CheckpointManifest& m);

// The manifest's own consistency alone (no file opened): parameters, model keys, shard list and
// its coverage of [0, flat_padded). What a resume checks before it reads a shard.
std::vector<std::string> verify_manifest(const CheckpointManifest& m);

}  // namespace gpt2
