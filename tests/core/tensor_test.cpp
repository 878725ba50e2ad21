#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/check.h"

using core::Shape;
using core::Tensor;

TEST(Tensor, EmptyHasShapeStridesAndAlignedStorage) {
  Tensor t = Tensor::empty({3, 5, 7});
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.strides(), (Shape{35, 7, 1}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % core::CpuAllocator::kAlignment, 0u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.str(), "f32[3, 5, 7] cpu");
}

TEST(Tensor, ViewsShareStorageWithoutCopy) {
  Tensor t = Tensor::zeros({4, 6});
  Tensor rows = t.slice(0, 1, 2);
  rows.at({1, 3}) = 5.0f;
  EXPECT_EQ(t.at({2, 3}), 5.0f);
  Tensor row = t.select(2);
  EXPECT_EQ(row.shape(), (Shape{6}));
  EXPECT_EQ(row.at({3}), 5.0f);
  Tensor flat = t.view({-1});
  EXPECT_EQ(flat.at({2 * 6 + 3}), 5.0f);
  Tensor cols = t.slice(1, 2, 3);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.at({2, 1}), 5.0f);
  EXPECT_EQ(cols.clone().to_vector()[2 * 3 + 1], 5.0f);
}

TEST(Tensor, AllocatorCountsLiveBytes) {
  size_t before = core::cpu_allocator().live_bytes();
  {
    Tensor t = Tensor::empty({1000});
    EXPECT_EQ(core::cpu_allocator().live_bytes(), before + 4000);
    Tensor alias = t.view({10, 100});
  }
  EXPECT_EQ(core::cpu_allocator().live_bytes(), before);
}

TEST(Tensor, BadViewsAreRefusedWithTheShapes) {
  Tensor t = Tensor::empty({4, 6});
  try {
    t.view({5, 5});
    FAIL() << "view of 24 elements as 25 was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[5, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.slice(0, 3, 2), core::Error);
  EXPECT_THROW(t.slice(1, 2, 3).view({-1}), core::Error);
}
