#include "src/onnx/onnx_export.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/base/errors.h"
#include "src/base/files.h"

#ifdef GPT2_WITH_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#endif

namespace gpt2::onnx_export {

#ifndef GPT2_WITH_ONNX

bool onnx_export_available() { return false; }

void write_onnx(const std::string& dir, const GraphShape&, const std::vector<Weight>&) {
  throw UserError("cannot export " + dir +
                  ": this build has no ONNX support (libonnx-dev was not found when "
                  "CMake configured it; launch/install-deps.sh installs it)");
}

#else

bool onnx_export_available() { return true; }

namespace {

constexpr int kOpset = 17;
constexpr int64_t kDataAlign = 4096;  // each weight starts on a page: ONNX Runtime can map it
const char* const kDataFile = "model.onnx.data";

// The weights file both graphs point into: each weight once, at a 4 KiB-aligned offset.
struct WeightData {
  struct Entry {
    const Weight* weight;
    int64_t offset;
  };
  std::vector<Entry> entries;
  int32_t elem_type = onnx::TensorProto::FLOAT;

  WeightData(const std::vector<Weight>& weights, int32_t elem) : elem_type(elem) {
    int64_t size = 0;
    for (const Weight& w : weights) {
      entries.push_back({&w, size});
      size = (size + w.bytes + kDataAlign - 1) / kDataAlign * kDataAlign;
    }
  }
  void write(const std::string& path) const {
    files::write_durably(path, [&](const std::string& tmp) {
      std::ofstream out(tmp, std::ios::binary);
      int64_t at = 0;
      for (const Entry& e : entries) {
        const std::string pad(static_cast<size_t>(e.offset - at), '\0');
        out.write(pad.data(), static_cast<std::streamsize>(pad.size()));
        out.write(static_cast<const char*>(e.weight->data), static_cast<std::streamsize>(e.weight->bytes));
        at = e.offset + e.weight->bytes;
      }
      out.flush();
      if (!out) throw UserError("cannot write " + tmp);
    });
  }
};

// A graph under construction: nodes in order, outputs named n0, n1, ... unless named.
class GraphBuilder {
 public:
  explicit GraphBuilder(onnx::GraphProto* g) : g_(g) {}

  struct Attr {
    std::string name;
    onnx::AttributeProto proto;
  };
  static Attr int_attr(const std::string& name, int64_t v) {
    Attr a{name, {}};
    a.proto.set_type(onnx::AttributeProto::INT);
    a.proto.set_i(v);
    return a;
  }
  static Attr float_attr(const std::string& name, float v) {
    Attr a{name, {}};
    a.proto.set_type(onnx::AttributeProto::FLOAT);
    a.proto.set_f(v);
    return a;
  }
  static Attr ints_attr(const std::string& name, const std::vector<int64_t>& v) {
    Attr a{name, {}};
    a.proto.set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a.proto.add_ints(x);
    return a;
  }

  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs, int n_out,
                                const std::vector<Attr>& attrs = {}, const std::vector<std::string>& names = {}) {
    onnx::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(g_->node_size()));
    for (const auto& in : inputs) n->add_input(in);
    std::vector<std::string> outs;
    for (int i = 0; i < n_out; ++i) {
      outs.push_back(i < static_cast<int>(names.size()) ? names[i] : "n" + std::to_string(next_++));
      n->add_output(outs.back());
    }
    for (const Attr& a : attrs) {
      onnx::AttributeProto* p = n->add_attribute();
      *p = a.proto;
      p->set_name(a.name);
    }
    return outs;
  }
  std::string op(const std::string& type, const std::vector<std::string>& inputs, const std::vector<Attr>& attrs = {}) {
    return node(type, inputs, 1, attrs).front();
  }

  // Small constants, stored in the graph itself: int64 vectors, and fp32 scalars cast to the
  // graph's float type.
  std::string ints(const std::vector<int64_t>& v, bool as_scalar = false) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name("c" + std::to_string(next_++));
    if (!as_scalar) t->add_dims(static_cast<int64_t>(v.size()));
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t x : v) t->add_int64_data(x);
    return t->name();
  }
  std::string scalar(float v, int32_t elem) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name("c" + std::to_string(next_++));
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(v);
    return elem == onnx::TensorProto::FLOAT ? t->name() : op("Cast", {t->name()}, {int_attr("to", elem)});
  }

  // A weight, stored in the shared data file.
  std::string weight(const WeightData::Entry& e, int32_t elem) {
    onnx::TensorProto* t = g_->add_initializer();
    t->set_name(e.weight->name);
    for (int64_t d : e.weight->shape) t->add_dims(d);
    t->set_data_type(elem);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    const std::pair<const char*, std::string> kv[] = {
        {"location", kDataFile}, {"offset", std::to_string(e.offset)}, {"length", std::to_string(e.weight->bytes)}};
    for (const auto& [k, v] : kv) {
      auto* entry = t->add_external_data();
      entry->set_key(k);
      entry->set_value(v);
    }
    return e.weight->name;
  }

  // A graph input or output: elem type and dims, a dim given by name (dynamic) or size.
  void value(bool input, const std::string& name, int32_t elem, const std::vector<std::string>& dims) {
    onnx::ValueInfoProto* v = input ? g_->add_input() : g_->add_output();
    v->set_name(name);
    auto* tensor = v->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(elem);
    for (const auto& d : dims) {
      auto* dim = tensor->mutable_shape()->add_dim();
      if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0])))
        dim->set_dim_value(std::stoll(d));
      else
        dim->set_dim_param(d);
    }
  }

 private:
  onnx::GraphProto* g_;
  int64_t next_ = 0;
};

using A = GraphBuilder;

// GPT-2's forward as ONNX nodes.
void build_graph(GraphBuilder& b, const GraphShape& shape, const WeightData& data, bool with_past) {
  const int32_t elem = data.elem_type;
  std::set<std::string> added;  // wte is read twice: one initializer
  auto W = [&](const std::string& name) {
    for (const auto& e : data.entries)
      if (e.weight->name == name) return added.insert(name).second ? b.weight(e, elem) : name;
    throw UserError("ONNX export: no weight named " + name);
  };
  const int64_t C = shape.n_embd, H = shape.n_head, D = C / H;
  const std::string hd = std::to_string(D), heads = std::to_string(H);
  b.value(true, "input_ids", onnx::TensorProto::INT64, {"batch", "sequence"});
  for (int64_t l = 0; with_past && l < shape.n_layer; ++l)
    for (const char* kv : {"key", "value"})
      b.value(true, "past_key_values." + std::to_string(l) + "." + kv, elem, {"batch", heads, "past_sequence", hd});

  // Positions [P, P + S): P from the first past key's length (0 without a past).
  const std::string seq = b.op("Shape", {"input_ids"}, {A::int_attr("start", 1), A::int_attr("end", 2)});
  const std::string past =
      with_past ? b.op("Shape", {"past_key_values.0.key"}, {A::int_attr("start", 2), A::int_attr("end", 3)})
                : b.ints({0});
  const std::string total = b.op("Add", {past, seq});
  const std::string zero_axis = b.ints({0});
  const std::string past_s = b.op("Squeeze", {past, zero_axis}), total_s = b.op("Squeeze", {total, zero_axis});
  const std::string positions = b.op("Range", {past_s, total_s, b.ints({1}, /*as_scalar=*/true)});
  std::string x = b.op("Add", {b.op("Gather", {W("transformer.wte.weight"), "input_ids"}),
                               b.op("Gather", {W("transformer.wpe.weight"), positions})});

  // Causal mask over (S, P + S): query i sees keys j <= i + P (Trilu keeps j - i <= k = P).
  A::Attr one{"value", {}};
  one.proto.set_type(onnx::AttributeProto::TENSOR);
  one.proto.mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  one.proto.mutable_t()->add_dims(1);
  one.proto.mutable_t()->add_float_data(1.0f);
  const std::string ones = b.op("ConstantOfShape", {b.op("Concat", {seq, total}, {A::int_attr("axis", 0)})}, {one});
  const std::string mask = b.op("Cast", {b.op("Trilu", {ones, past_s}, {A::int_attr("upper", 0)})},
                                {A::int_attr("to", onnx::TensorProto::BOOL)});
  const std::string minus_inf = b.scalar(-std::numeric_limits<float>::infinity(), elem);
  const std::string scale = b.scalar(static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), elem);
  const std::string split = b.ints({C, C, C}), heads_shape = b.ints({0, 0, H, D}), merged_shape = b.ints({0, 0, C});

  auto layer_norm = [&](const std::string& in, const std::string& prefix) {
    return b.op("LayerNormalization", {in, W(prefix + ".weight"), W(prefix + ".bias")},
                {A::int_attr("axis", -1), A::float_attr("epsilon", 1e-5f)});
  };
  auto linear = [&](const std::string& in, const std::string& prefix) {
    return b.op("Add", {b.op("MatMul", {in, W(prefix + ".weight")}), W(prefix + ".bias")});
  };
  auto to_heads = [&](const std::string& t) {  // (B, S, C) -> (B, H, S, D)
    return b.op("Transpose", {b.op("Reshape", {t, heads_shape})}, {A::ints_attr("perm", {0, 2, 1, 3})});
  };
  const std::string half = b.scalar(0.5f, elem), one_f = b.scalar(1.0f, elem);
  const std::string gelu_c = b.scalar(static_cast<float>(std::sqrt(2.0 / M_PI)), elem);
  const std::string gelu_k = b.scalar(0.044715f, elem);
  auto gelu = [&](const std::string& in) {  // tanh GELU: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))
    const std::string cube = b.op("Mul", {b.op("Mul", {in, in}), in});
    const std::string inner = b.op("Mul", {gelu_c, b.op("Add", {in, b.op("Mul", {gelu_k, cube})})});
    return b.op("Mul", {b.op("Mul", {half, in}), b.op("Add", {one_f, b.op("Tanh", {inner})})});
  };

  for (int64_t l = 0; l < shape.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l), L = std::to_string(l);
    const std::string qkv = linear(layer_norm(x, p + ".ln_1"), p + ".attn.c_attn");
    const auto parts = b.node("Split", {qkv, split}, 3, {A::int_attr("axis", 2)});
    const std::string q = to_heads(parts[0]);
    std::string k = to_heads(parts[1]), v = to_heads(parts[2]);
    if (with_past) {
      k = b.op("Concat", {"past_key_values." + L + ".key", k}, {A::int_attr("axis", 2)});
      v = b.op("Concat", {"past_key_values." + L + ".value", v}, {A::int_attr("axis", 2)});
      b.node("Identity", {k}, 1, {}, {"present." + L + ".key"});
      b.node("Identity", {v}, 1, {}, {"present." + L + ".value"});
    }
    const std::string kt = b.op("Transpose", {k}, {A::ints_attr("perm", {0, 1, 3, 2})});
    const std::string scores = b.op("Mul", {b.op("MatMul", {q, kt}), scale});
    const std::string att = b.op("Softmax", {b.op("Where", {mask, scores, minus_inf})}, {A::int_attr("axis", -1)});
    const std::string heads_out = b.op("Transpose", {b.op("MatMul", {att, v})}, {A::ints_attr("perm", {0, 2, 1, 3})});
    x = b.op("Add", {x, linear(b.op("Reshape", {heads_out, merged_shape}), p + ".attn.c_proj")});
    x = b.op("Add", {x, linear(gelu(linear(layer_norm(x, p + ".ln_2"), p + ".mlp.c_fc")), p + ".mlp.c_proj")});
  }
  // The tied head: (B·S, C) x wteᵀ, the padded rows sliced off, fp32 out.
  const std::string flat = b.op("Reshape", {layer_norm(x, "transformer.ln_f"), b.ints({-1, C})});
  const std::string logits_flat = b.op("Gemm", {flat, W("transformer.wte.weight")}, {A::int_attr("transB", 1)});
  const std::string batch_seq = b.op("Shape", {"input_ids"});
  const std::string logits_padded =
      b.op("Reshape", {logits_flat, b.op("Concat", {batch_seq, b.ints({-1})}, {A::int_attr("axis", 0)})});
  const std::string logits = b.op("Slice", {logits_padded, b.ints({0}), b.ints({shape.vocab_size}), b.ints({2})});
  b.node("Cast", {logits}, 1, {A::int_attr("to", onnx::TensorProto::FLOAT)}, {"logits"});
  b.value(false, "logits", onnx::TensorProto::FLOAT, {"batch", "sequence", std::to_string(shape.vocab_size)});
  for (int64_t l = 0; with_past && l < shape.n_layer; ++l)
    for (const char* kv : {"key", "value"})
      b.value(false, "present." + std::to_string(l) + "." + kv, elem, {"batch", heads, "total_sequence", hd});
}

onnx::ModelProto make_model(const GraphShape& shape, const WeightData& data, bool with_past) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("gpt2-dist");
  model.set_model_version(1);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name(with_past ? "gpt2_with_past" : "gpt2");
  GraphBuilder b(g);
  build_graph(b, shape, data, with_past);
  return model;
}

}  // namespace

void write_onnx(const std::string& dir, const GraphShape& shape, const std::vector<Weight>& weights) {
  files::create_directories(dir);
  const WeightData data(weights, shape.fp16 ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT);
  data.write(files::join(dir, kDataFile));
  for (const bool with_past : {false, true}) {
    const std::string path = files::join(dir, with_past ? "model_with_past.onnx" : "model.onnx");
    onnx::ModelProto m = make_model(shape, data, with_past);
    try {
      onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict=*/1));
    } catch (const std::exception& e) {
      throw Error("ONNX export: shape inference of " + path + " failed: " + e.what());
    }
    files::write_durably(path, [&](const std::string& tmp) {
      {
        std::ofstream out(tmp, std::ios::binary);
        if (!m.SerializeToOstream(&out)) throw UserError("cannot write " + tmp);
      }
      try {
        onnx::checker::check_model(tmp);  // reads model.onnx.data beside it
      } catch (const std::exception& e) {
        throw Error("ONNX export: " + path + " fails onnx::checker: " + e.what());
      }
    });
  }
}

#endif

}  // namespace gpt2::onnx_export
