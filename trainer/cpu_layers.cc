// CPU reference layers; see cpu_layers.h. Follows llm.c's train_gpt2.c closely.
#include "trainer/cpu_layers.h"

#include <cblas.h>

#include <cmath>

namespace gradsnap {
namespace trainer {

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<int64_t>(b) * T + t) * C;
      const float* te = wte + static_cast<int64_t>(inp[b * T + t]) * C;
      const float* pe = wpe + static_cast<int64_t>(t) * C;
      for (int i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<int64_t>(b) * T + t) * C;
      float* dte = dwte + static_cast<int64_t>(inp[b * T + t]) * C;
      float* dpe = dwpe + static_cast<int64_t>(t) * C;
      for (int i = 0; i < C; ++i) {
        dte[i] += d[i];
        dpe[i] += d[i];
      }
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C) {
  const float eps = 1e-5f;
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
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
    float* o = out + static_cast<int64_t>(n) * C;
    for (int i = 0; i < C; ++i) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean,
                       const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<int64_t>(n) * C;
    const float* x = inp + static_cast<int64_t>(n) * C;
    float* dx = dinp + static_cast<int64_t>(n) * C;
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
      dbias[i] += d[i];
      dweight[i] += norm * d[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
              out, OC);
  if (bias == nullptr) return;
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<int64_t>(n) * OC;
    for (int j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                    const float* inp, const float* weight, int N, int C, int OC) {
  // dinp (N,C) += dout (N,OC) @ weight (OC,C)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
              1.0f, dinp, C);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias == nullptr) return;
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<int64_t>(n) * OC;
    for (int j = 0; j < OC; ++j) dbias[j] += d[j];
  }
}

void AttentionForward(float* out, float* preatt, float* att, const float* inp, int B, int T,
                      int C, int NH) {
  const int C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const float* q = inp + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        float* pre = preatt + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float* a = att + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float maxval = -1e30f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (static_cast<int64_t>(b) * T + t2) * C3 + h * hs + C;
          float dot = 0.0f;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          pre[t2] = dot;
          if (dot > maxval) maxval = dot;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          float e = std::exp(pre[t2] - maxval);
          a[t2] = e;
          sum += e;
        }
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (int t2 = 0; t2 < T; ++t2) {
          if (t2 <= t) {
            a[t2] *= inv;
          } else {
            a[t2] = 0.0f;
            pre[t2] = 0.0f;
          }
        }
        float* o = out + (static_cast<int64_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (static_cast<int64_t>(b) * T + t2) * C3 + h * hs + 2 * C;
          const float w = a[t2];
          for (int i = 0; i < hs; ++i) o[i] += w * v[i];
        }
      }
    }
  }
}

void AttentionBackward(float* dinp, float* dpreatt, float* datt, const float* dout,
                       const float* inp, const float* att, int B, int T, int C, int NH) {
  const int C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const int64_t row = ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        const float* a = att + row;
        float* da = datt + row;
        float* dpre = dpreatt + row;
        const float* q = inp + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        float* dq = dinp + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        const float* d = dout + (static_cast<int64_t>(b) * T + t) * C + h * hs;
        // Backward through the weighted sum of values.
        for (int t2 = 0; t2 <= t; ++t2) {
          const int64_t base = (static_cast<int64_t>(b) * T + t2) * C3 + h * hs;
          const float* v = inp + base + 2 * C;
          float* dv = dinp + base + 2 * C;
          for (int i = 0; i < hs; ++i) {
            da[t2] += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
        }
        // Backward through the softmax.
        for (int t2 = 0; t2 <= t; ++t2) {
          for (int t3 = 0; t3 <= t; ++t3) {
            const float indicator = t2 == t3 ? 1.0f : 0.0f;
            dpre[t3] += a[t2] * (indicator - a[t3]) * da[t2];
          }
        }
        // Backward through q . k.
        for (int t2 = 0; t2 <= t; ++t2) {
          const int64_t base = (static_cast<int64_t>(b) * T + t2) * C3 + h * hs + C;
          const float* k = inp + base;
          float* dk = dinp + base;
          for (int i = 0; i < hs; ++i) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}  // namespace

void GeluForward(float* out, const float* inp, int N) {
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int N) {
  for (int i = 0; i < N; ++i) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float arg = kGeluScale * (x + cube);
    const float th = std::tanh(arg);
    const float ch = std::cosh(arg);
    const float sech2 = 1.0f / (ch * ch);
    const float grad =
        0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

void ResidualForward(float* out, const float* inp1, const float* inp2, int N) {
  for (int i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int N) {
  for (int i = 0; i < N; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

void SoftmaxForward(float* probs, const float* logits, int BT, int V) {
  for (int n = 0; n < BT; ++n) {
    const float* l = logits + static_cast<int64_t>(n) * V;
    float* p = probs + static_cast<int64_t>(n) * V;
    float maxval = -1e30f;
    for (int i = 0; i < V; ++i) maxval = l[i] > maxval ? l[i] : maxval;
    float sum = 0.0f;
    for (int i = 0; i < V; ++i) {
      p[i] = std::exp(l[i] - maxval);
      sum += p[i];
    }
    for (int i = 0; i < V; ++i) p[i] /= sum;
  }
}

void CrossEntropyForward(float* losses, const float* probs, const int32_t* targets, int BT,
                         int V) {
  for (int n = 0; n < BT; ++n) {
    losses[n] = -std::log(probs[static_cast<int64_t>(n) * V + targets[n]]);
  }
}

void CrossEntropySoftmaxBackward(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int BT, int V) {
  for (int n = 0; n < BT; ++n) {
    float* dl = dlogits + static_cast<int64_t>(n) * V;
    const float* p = probs + static_cast<int64_t>(n) * V;
    for (int i = 0; i < V; ++i) {
      const float indicator = i == targets[n] ? 1.0f : 0.0f;
      dl[i] += (p[i] - indicator) * dloss;
    }
  }
}

}  // namespace trainer
}  // namespace gradsnap
