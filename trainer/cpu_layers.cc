// CPU layers; see cpu_layers.h. The layer arithmetic follows llm.c's train_gpt2.c; attention
// runs its products through OpenBLAS and its softmax backward in linear time per row.
#include "trainer/cpu_layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace gradsnap {
namespace trainer {
namespace {

// Runs fn over the items [0, n), each of about `cost` elements of work, on the pool; below
// kMinParallelElements in all, on the caller (waking the workers costs more).
constexpr int64_t kMinParallelElements = 4096;
void For(ThreadPool* pool, int64_t n, int64_t cost, const std::function<void(size_t, size_t)>& fn) {
  const int64_t min_n = std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, cost));
  ParallelFor(pool, static_cast<size_t>(n), fn, static_cast<size_t>(min_n));
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// tanh as Eigen's rational approximation (generic_fast_tanh_float): a few ulp from the exact
// value, branch-free, so the GELU loops vectorize. Plain IEEE operations: the same bits on every
// x86-64 host (the build passes -ffp-contract=off).
inline float Tanh(float x) {
  const float c = 7.90531110763549805f;
  const float xc = std::min(std::max(x, -c), c);
  const float x2 = xc * xc;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  p = xc * p;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  const float r = p / q;
  return std::fabs(x) < 0.0004f ? x : r;
}

inline float Gelu(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + Tanh(kGeluScale * (x + cube)));
}

// Sums column j of `rows` rows (stride `ld`) into acc[j] for j in [j0, j1), rows in order.
void AddRowsToColumns(float* acc, const float* rows, int64_t n_rows, int64_t ld, size_t j0,
                      size_t j1) {
  for (int64_t n = 0; n < n_rows; ++n) {
    const float* r = rows + n * ld;
    for (size_t j = j0; j < j1; ++j) acc[j] += r[j];
  }
}

}  // namespace

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, ThreadPool* pool) {
  For(pool, static_cast<int64_t>(B) * T, C, [&](size_t lo, size_t hi) {
    for (size_t bt = lo; bt < hi; ++bt) {
      float* o = out + bt * C;
      const float* te = wte + static_cast<int64_t>(inp[bt]) * C;
      const float* pe = wpe + static_cast<int64_t>(bt % T) * C;
      for (int i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
  });
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                     int T, int C, ThreadPool* pool) {
  // Split by channel: every element of dwte and dwpe sums its tokens in (b, t) order.
  const int64_t BT = static_cast<int64_t>(B) * T;
  For(pool, C, 2 * BT, [&](size_t c0, size_t c1) {
    for (int64_t bt = 0; bt < BT; ++bt) {
      const float* d = dout + bt * C;
      float* dte = dwte + static_cast<int64_t>(inp[bt]) * C;
      float* dpe = dwpe + (bt % T) * C;
      for (size_t i = c0; i < c1; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
  });
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, ThreadPool* pool) {
  const float eps = 1e-5f;
  For(pool, N, 3 * C, [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      const float* x = inp + n * C;
      float m = 0.0f;
      for (int i = 0; i < C; ++i) m += x[i];
      m /= C;
      float var = 0.0f;
      for (int i = 0; i < C; ++i) {
        float d = x[i] - m;
        var += d * d;
      }
      var /= C;
      float s = 1.0f / std::sqrt(var + eps);
      float* o = out + n * C;
      for (int i = 0; i < C; ++i) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int N, int C, ThreadPool* pool) {
  // dinp row by row.
  For(pool, N, 3 * C, [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      const float* d = dout + n * C;
      const float* x = inp + n * C;
      float* dx = dinp + n * C;
      const float m = mean[n], s = rstd[n];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
      for (int i = 0; i < C; ++i) {
        float norm = (x[i] - m) * s;
        float dnorm = weight[i] * d[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      for (int i = 0; i < C; ++i) {
        float norm = (x[i] - m) * s;
        float dnorm = weight[i] * d[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  // dweight and dbias column by column, rows in order.
  For(pool, C, 2 * static_cast<int64_t>(N), [&](size_t i0, size_t i1) {
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * C;
      const float* x = inp + static_cast<int64_t>(n) * C;
      const float m = mean[n], s = rstd[n];
      for (size_t i = i0; i < i1; ++i) {
        float norm = (x[i] - m) * s;
        dbias[i] += d[i];
        dweight[i] += norm * d[i];
      }
    }
  });
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, ThreadPool* pool) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
              out, OC);
  if (bias == nullptr) return;
  For(pool, N, OC, [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      float* o = out + n * OC;
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    }
  });
}

void MatmulGeluForward(float* pre, float* out, const float* inp, const float* weight,
                       const float* bias, int N, int C, int OC, ThreadPool* pool) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
              pre, OC);
  For(pool, N, 8 * static_cast<int64_t>(OC), [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      float* p = pre + n * OC;
      float* o = out + n * OC;
      for (int j = 0; j < OC; ++j) {
        const float x = p[j] + bias[j];
        p[j] = x;
        o[j] = Gelu(x);
      }
    }
  });
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int N, int C, int OC,
                    ThreadPool* pool) {
  // dinp (N,C) += dout (N,OC) @ weight (OC,C)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
              1.0f, dinp, C);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias == nullptr) return;
  For(pool, OC, N, [&](size_t j0, size_t j1) { AddRowsToColumns(dbias, dout, N, OC, j0, j1); });
}

// Attention, per sequence b and head h: Q, K, V are the (T, hs) blocks of inp at columns
// h*hs, C + h*hs, 2C + h*hs (row stride 3C); S = preatt, A = att are (T, T).
//   forward:  S = scale * Q K^T (causal: zero above the diagonal), A = softmax_rows(S),
//             out = A V
//   backward: dA = dout V^T, dV += A^T dout, dS = A * (dA - rowsum(A * dA)),
//             dQ += scale * dS K, dK += scale * dS^T Q
// The products are OpenBLAS calls (T x T x hs each). The (b, h) pairs are split over the pool,
// each computed whole by one thread (they write disjoint blocks); meanwhile OpenBLAS runs on one
// thread per call, its count restored after.
namespace {

void ForEachHead(ThreadPool* pool, int B, int NH, int T, int hs,
                 const std::function<void(int64_t b, int h)>& fn) {
  const bool split = pool != nullptr && pool->threads() > 1;
  const int blas_threads = openblas_get_num_threads();
  if (split) openblas_set_num_threads(1);
  For(pool, static_cast<int64_t>(B) * NH, 4 * static_cast<int64_t>(T) * T * hs,
      [&](size_t lo, size_t hi) {
        for (size_t k = lo; k < hi; ++k) fn(static_cast<int64_t>(k / NH), static_cast<int>(k % NH));
      });
  if (split) openblas_set_num_threads(blas_threads);
}

}  // namespace

void AttentionForward(float* out, float* preatt, float* att, const float* inp, int B, int T,
                      int C, int NH, ThreadPool* pool) {
  const int C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  ForEachHead(pool, B, NH, T, hs, [&](int64_t b, int h) {
    const float* q = inp + b * T * C3 + h * hs;
    float* s = preatt + (b * NH + h) * TT;
    float* a = att + (b * NH + h) * TT;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, q + C, C3, 0.0f,
                s, T);
    for (int t = 0; t < T; ++t) {
      float* pre = s + static_cast<int64_t>(t) * T;
      float* ar = a + static_cast<int64_t>(t) * T;
      float maxval = -1e30f;
      for (int t2 = 0; t2 <= t; ++t2) maxval = pre[t2] > maxval ? pre[t2] : maxval;
      float sum = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float e = std::exp(pre[t2] - maxval);
        ar[t2] = e;
        sum += e;
      }
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      for (int t2 = 0; t2 <= t; ++t2) ar[t2] *= inv;
      for (int t2 = t + 1; t2 < T; ++t2) {
        ar[t2] = 0.0f;
        pre[t2] = 0.0f;
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, q + 2 * C, C3,
                0.0f, out + b * T * C + h * hs, C);
  });
}

void AttentionBackward(float* dinp, float* dpreatt, float* datt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH,
                       ThreadPool* pool) {
  const int C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  ForEachHead(pool, B, NH, T, hs, [&](int64_t b, int h) {
    const int64_t base = b * T * C3 + h * hs;
    const float* q = inp + base;
    float* dq = dinp + base;
    const float* a = att + (b * NH + h) * TT;
    float* da = datt + (b * NH + h) * TT;
    float* ds = dpreatt + (b * NH + h) * TT;
    const float* d = dout + b * T * C + h * hs;
    // dA = dout V^T; dV += A^T dout
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, q + 2 * C, C3,
                0.0f, da, T);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, 1.0f,
                dq + 2 * C, C3);
    // dS, row by row, linear in the row length.
    for (int t = 0; t < T; ++t) {
      const float* ar = a + static_cast<int64_t>(t) * T;
      const float* dar = da + static_cast<int64_t>(t) * T;
      float* dsr = ds + static_cast<int64_t>(t) * T;
      float dot = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) dot += ar[t2] * dar[t2];
      for (int t2 = 0; t2 <= t; ++t2) dsr[t2] = ar[t2] * (dar[t2] - dot);
      for (int t2 = t + 1; t2 < T; ++t2) dsr[t2] = 0.0f;
    }
    // dQ += scale dS K; dK += scale dS^T Q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, ds, T, q + C, C3,
                1.0f, dq, C3);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, ds, T, q, C3, 1.0f,
                dq + C, C3);
  });
}

void GeluForward(float* out, const float* inp, int N, ThreadPool* pool) {
  For(pool, N, 8, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) out[i] = Gelu(inp[i]);
  });
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int N, ThreadPool* pool) {
  For(pool, N, 8, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      const float x = inp[i];
      const float cube = 0.044715f * x * x * x;
      const float th = Tanh(kGeluScale * (x + cube));
      const float sech2 = 1.0f - th * th;
      const float grad =
          0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      dinp[i] += grad * dout[i];
    }
  });
}

void ResidualForward(float* out, const float* inp1, const float* inp2, int N, ThreadPool* pool) {
  For(pool, N, 1, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) out[i] = inp1[i] + inp2[i];
  });
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int N, ThreadPool* pool) {
  For(pool, N, 1, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      dinp1[i] += dout[i];
      dinp2[i] += dout[i];
    }
  });
}

void SoftmaxForward(float* probs, const float* logits, int BT, int V, ThreadPool* pool) {
  For(pool, BT, 4 * static_cast<int64_t>(V), [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      const float* l = logits + n * V;
      float* p = probs + n * V;
      float maxval = -1e30f;
      for (int i = 0; i < V; ++i) maxval = l[i] > maxval ? l[i] : maxval;
      float sum = 0.0f;
      for (int i = 0; i < V; ++i) {
        p[i] = std::exp(l[i] - maxval);
        sum += p[i];
      }
      for (int i = 0; i < V; ++i) p[i] /= sum;
    }
  });
}

void CrossEntropyForward(float* losses, const float* probs, const int32_t* targets, int BT,
                         int V, ThreadPool* pool) {
  For(pool, BT, 16, [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) losses[n] = -std::log(probs[n * V + targets[n]]);
  });
}

void CrossEntropySoftmaxBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int BT, int V, ThreadPool* pool) {
  For(pool, BT, V, [&](size_t lo, size_t hi) {
    for (size_t n = lo; n < hi; ++n) {
      float* dl = dlogits + n * V;
      const float* p = probs + n * V;
      for (int i = 0; i < V; ++i) {
        const float indicator = i == targets[n] ? 1.0f : 0.0f;
        dl[i] += (p[i] - indicator) * dloss;
      }
    }
  });
}

}  // namespace trainer
}  // namespace gradsnap
