#include "nn/embedding.h"

#include "autograd/ops.h"  // defines: index_select, min, max

namespace loom::nn {

Embedding::Embedding(int64_t num_embeddings_, int64_t embedding_dim_)
    : Cloneable("Embedding"), num_embeddings(num_embeddings_), embedding_dim(embedding_dim_) {
  LOOM_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: expected positive num_embeddings and "
             "embedding_dim, got ", num_embeddings, " and ", embedding_dim);
  reset();
}

void Embedding::reset() {
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters();
}

void Embedding::reset_parameters() { init::normal_(weight); }

Tensor Embedding::forward(const Tensor& input) {
  LOOM_CHECK(input.defined() && input.dtype() == kInt64, "Embedding: expected int64 indices, got ",
             input.defined() ? dtype_name(input.dtype()) : "an undefined tensor",
             "; convert with .to(kInt64)");
  if (input.numel() > 0) {
    const int64_t lo = min(input).item<int64_t>(), hi = max(input).item<int64_t>();
    LOOM_CHECK(lo >= 0 && hi < num_embeddings, "Embedding: index out of range: expected indices in [0, ",
               num_embeddings, "), got values from ", lo, " to ", hi);
  }
  Shape shape = input.shape();
  shape.push_back(embedding_dim);
  return index_select(weight, 0, input.reshape({-1})).reshape(shape);
}

std::string Embedding::extra_repr() const { return detail::str(num_embeddings, ", ", embedding_dim); }

}  // namespace loom::nn
