// eigh: the eigenvalues and eigenvectors of a symmetric matrix, as torch.linalg.eigh.
//
//   auto [values, vectors] = loom::linalg::eigh(covariance);   // covariance: [n, n], symmetric
//   // values: [n], ascending; vectors: [n, n], column k the unit eigenvector of values[k]
//
// CPU only, float32 or float64, computed by LAPACK's divide-and-conquer dsyevd (from
// OpenBLAS, which bundles LAPACK) in float64 whatever the input dtype, then rounded: the
// matrices this serves are small (the speedrun's 12x12 patch covariance), and float64 costs
// nothing there while keeping the small eigenvalues, which whitening divides by, accurate.
// Like torch with UPLO="L", only the lower triangle is read. No gradient: a tensor that
// requires grad under grad mode is refused (detach it, or call under NoGradGuard).
#pragma once

#include <utility>

#include "core/tensor.h"

namespace loom::linalg {

std::pair<Tensor, Tensor> eigh(const Tensor& a);

}  // namespace loom::linalg
