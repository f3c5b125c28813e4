// What batchcast writes itself beside torch's stable API (tensor/tensor.h):
// the serial strided copy to host memory, the join along dim 0, clones, the
// release of wrapped memory, dtype names, CUDA's absence. Checked against
// full LibTorch's own results.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/tensor/aten.h"
#include "batchcast/tensor/tensor.h"

using namespace batchcast;

namespace {

std::vector<std::byte> host_bytes(const at::Tensor& t) {
  std::vector<std::byte> out(nbytes(from_aten(t)));
  copy_to_host(out.data(), from_aten(t));
  return out;
}

std::vector<std::byte> expected_bytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const std::byte*>(c.data_ptr());
  return std::vector<std::byte>(p, p + c.nbytes());
}

}  // namespace

TEST(Tensor, CopyToHostWritesEveryLayoutRowMajor) {
  std::mt19937 random(7);
  const std::vector<at::ScalarType> dtypes = {at::kByte, at::kShort, at::kFloat, at::kDouble, at::kComplexDouble};
  int checked = 0;
  for (int round = 0; round < 300; ++round) {
    const at::ScalarType dtype = dtypes[random() % dtypes.size()];
    const int dims = 1 + static_cast<int>(random() % 4);
    std::vector<int64_t> shape;
    for (int d = 0; d < dims; ++d) shape.push_back(1 + static_cast<int64_t>(random() % 5));
    at::Tensor t = at::randn(shape, at::kDouble).mul(100).to(dtype);
    // A random view of it: permuted, narrowed, strided, expanded.
    std::vector<int64_t> order(dims);
    for (int d = 0; d < dims; ++d) order[d] = d;
    std::shuffle(order.begin(), order.end(), random);
    t = t.permute(order);
    const int d = static_cast<int>(random() % dims);
    if (t.size(d) > 2 && random() % 2) t = t.narrow(d, 1, t.size(d) - 2);
    if (t.size(d) > 1 && random() % 2) t = t.slice(d, 0, t.size(d), 2);
    if (random() % 4 == 0) {  // a dimension of stride 0
      std::vector<int64_t> expanded = t.sizes().vec();
      expanded.insert(expanded.begin(), 3);
      t = t.unsqueeze(0).expand(expanded);
    }
    ASSERT_EQ(host_bytes(t), expected_bytes(t)) << "round " << round << ": sizes " << t.sizes() << " strides "
                                                << t.strides();
    checked += t.is_contiguous() ? 0 : 1;
  }
  EXPECT_GT(checked, 150);  // most were strided
}

TEST(Tensor, CopyToHostOfAnEmptyTensorWritesNothing) {
  std::byte guard{0x5a};
  copy_to_host(&guard, from_aten(at::zeros({0, 3})));
  EXPECT_EQ(guard, std::byte{0x5a});
}

TEST(Tensor, CatRowsJoinsPiecesAlongDimZero) {
  at::Tensor a = at::arange(0, 12, at::kLong).view({4, 3});
  at::Tensor b = at::arange(100, 106, at::kLong).view({3, 2}).t();  // strided, 2 rows
  at::Tensor c = at::arange(200, 203, at::kLong).view({1, 3});
  Tensor joined = cat_rows({from_aten(a), from_aten(b), from_aten(c)});
  EXPECT_TRUE(at::equal(to_aten(joined), at::cat({a, b, c})));
  EXPECT_TRUE(joined.is_contiguous());
  EXPECT_THROW(cat_rows({}), InvalidArgument);
}

TEST(Tensor, CloneIsAContiguousCopy) {
  at::Tensor t = at::arange(0, 24, at::kFloat).view({2, 3, 4}).permute({2, 0, 1});
  Tensor copy = clone(from_aten(t));
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_TRUE(at::equal(to_aten(copy), t));
  EXPECT_NE(copy.data_ptr(), t.data_ptr());
}

TEST(Tensor, WrappedMemoryIsReleasedOnceWhenTheLastReferenceGoes) {
  std::vector<int32_t> memory = {1, 2, 3, 4, 5, 6};
  int released = 0;
  Tensor t = wrap(memory.data(), {2, 3}, ScalarType::Int, cpu_device(), [&] { released += 1; });
  EXPECT_EQ(shape_of(t), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(nbytes(t), 24u);
  at::Tensor alias = to_aten(t);
  Tensor row = narrow(t, 0, 1, 1);
  t = Tensor();
  EXPECT_EQ(released, 0);
  alias.reset();
  EXPECT_EQ(released, 0);
  EXPECT_EQ(static_cast<int32_t*>(row.data_ptr())[0], 4);
  row = Tensor();
  EXPECT_EQ(released, 1);
}

TEST(Tensor, FullNarrowAndCopyInto) {
  Tensor padded = full({2, 4}, -1.0, ScalarType::Float, cpu_device());
  Tensor corner = narrow(narrow(padded, 0, 0, 2), 1, 0, 2);
  copy_into(corner, from_aten(at::ones({2, 2})));
  EXPECT_TRUE(at::equal(to_aten(padded), at::tensor({1.f, 1.f, -1.f, -1.f, 1.f, 1.f, -1.f, -1.f}).view({2, 4})));
}

TEST(Tensor, NamesAndDevices) {
  EXPECT_EQ(dtype_name(ScalarType::Float), "Float");
  EXPECT_EQ(dtype_name(ScalarType::Long), "Long");
  EXPECT_EQ(device_text(cpu_device()), "cpu");
  EXPECT_EQ(device_text(cuda_device(1)), "cuda:1");
}

TEST(Tensor, WithoutACudaTorchThereIsNoCurrentStream) {
  if (torch_has_cuda()) GTEST_SKIP() << "this torch is a CUDA build";
  try {
    current_cuda_stream(0);
    FAIL() << "a stream without CUDA";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA support"), std::string::npos) << e.what();
  }
}
