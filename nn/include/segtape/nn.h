// segtape's nn layer in one include: modules with PyTorch's names, shapes and
// initialisation, optimizers, gradient clipping, checkpoints.
#pragma once
#include "segtape/nn/checkpoint.h"
#include "segtape/nn/layers.h"
#include "segtape/nn/module.h"
#include "segtape/nn/optim.h"
#include "segtape/nn/random.h"
#include "segtape/nn/safetensors.h"
#include "segtape/ops.h"

namespace segtape::nn {
// The losses are the engine's fused ops, with PyTorch's semantics
// (cross_entropy: integer targets, ignore_index; mse_loss; Mean / Sum).
using segtape::cross_entropy;
using segtape::mse_loss;
using segtape::Reduction;
}  // namespace segtape::nn
