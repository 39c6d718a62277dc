#include "core/eigh.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "core/factory.h"

// LAPACK's Fortran entry point (OpenBLAS exports it; Debian ships no LAPACKE header for it).
// The two trailing lengths are the hidden lengths of the character arguments (gfortran's ABI).
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info, size_t jobz_len,
                        size_t uplo_len);

namespace loom::linalg {

std::pair<Tensor, Tensor> eigh(const Tensor& a) {
  LOOM_CHECK(a.defined(), "linalg.eigh: the input is undefined");
  LOOM_CHECK(a.dim() == 2 && a.size(0) == a.size(1), "linalg.eigh: expected a square matrix [n, n], got shape ",
             a.shape());
  LOOM_CHECK(a.device().is_cpu(), "linalg.eigh: runs on the CPU (LAPACK); got a tensor on ", a.device(),
             "; move it with .to(\"cpu\")");
  LOOM_CHECK(a.dtype() == kFloat32 || a.dtype() == kFloat64, "linalg.eigh: expected float32 or float64, got ",
             a.dtype());
  LOOM_CHECK(!(a.requires_grad() && GradMode::is_enabled()), "linalg.eigh: has no gradient in loom, but the input "
             "requires grad; pass a.detach() or call it under NoGradGuard");
  const int n = static_cast<int>(a.size(0));
  LOOM_CHECK(n > 0, "linalg.eigh: the matrix is empty");
  // Row-major in, column-major to LAPACK: the transpose of a symmetric matrix is itself, and
  // LAPACK's lower triangle (column-major) is the row-major upper one, so ask for "U" in
  // LAPACK's terms to read the row-major lower triangle, as torch's UPLO="L".
  std::vector<double> m = a.contiguous().to(kFloat64).tolist<double>();
  std::vector<double> w(static_cast<size_t>(n));
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "U", &n, m.data(), &n, w.data(), &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1);
  LOOM_CHECK(info == 0, "linalg.eigh: LAPACK dsyevd's workspace query failed (info = ", info, ")");
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  dsyevd_("V", "U", &n, m.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1);
  LOOM_CHECK(info >= 0, "linalg.eigh: LAPACK dsyevd: argument ", -info, " had an illegal value");
  LOOM_CHECK(info == 0, "linalg.eigh: LAPACK dsyevd failed to converge (info = ", info, "); the input may hold NaN "
             "or infinity");
  // Column-major V (column k = eigenvector k) read row-major is V^T: transpose it back.
  std::vector<double> vectors(m.size());
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c) vectors[static_cast<size_t>(r * n + c)] = m[static_cast<size_t>(c * n + r)];
  return {from_vector(w, {n}).to(a.dtype()), from_vector(vectors, {n, n}).to(a.dtype())};
}

}  // namespace loom::linalg
