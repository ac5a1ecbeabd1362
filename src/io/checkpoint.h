#pragma once
// Sharded checkpoints, all of it (layout in docs/DESIGN.md "Checkpoint layout as built"):
//   manifest.h          CheckpointManifest, find_checkpoint, verify_checkpoint_files, the names
//   checkpoint_writer.h CheckpointSettings, CheckpointWriter (snapshot, async writes, manifest, rename)
//   retention.h         keeping the newest checkpoint.keep complete checkpoints
//   resume.h            read_flat_range, resume_checkpoint (collective, any world size)
//   checkpoint_verify.h verify_checkpoint: every file's contents against the manifest (gpt2-ckpt verify)
// The model is the optimizer shards' fp32 masters; `gpt2-ckpt consolidate` makes a model file of it.
#include "src/io/checkpoint_verify.h"
#include "src/io/checkpoint_writer.h"
#include "src/io/manifest.h"
#include "src/io/resume.h"
#include "src/io/retention.h"
