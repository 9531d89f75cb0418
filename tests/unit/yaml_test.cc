// The YAML loader: every error is one line that starts with the file.
#include "runtime/common/yaml.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace eldr {
namespace {

namespace fs = std::filesystem;

class YamlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_yaml_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "f.yaml").string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(YamlTest, LoadsAMapping) {
  auto y = LoadYamlFile(Write("name: tiny\ndecode: {a: 1.5}\n"));
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ(y.value()["name"].as<std::string>(), "tiny");
  EXPECT_DOUBLE_EQ(y.value()["decode"]["a"].as<double>(), 1.5);
}

TEST_F(YamlTest, MissingFileIsNotFoundNamingIt) {
  const std::string path = (dir_ / "nope.yaml").string();
  auto y = LoadYamlFile(path);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(y.status().message(), path + ": no such file");
}

TEST_F(YamlTest, SyntaxErrorNamesFileAndLine) {
  const std::string path = Write("a: 1\nb: [1, 2\n");
  auto y = LoadYamlFile(path);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(y.status().message().rfind(path + ":", 0), 0u) << y.status().message();
  EXPECT_NE(y.status().message().find(": invalid YAML: "), std::string::npos) << y.status().message();
}

TEST_F(YamlTest, RootMustBeAMappingNamingTheDocument) {
  const std::string path = Write("- 1\n- 2\n");
  auto y = LoadYamlFile(path, "a model config");
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().message(), path + ": a model config must be a YAML mapping");
}

TEST_F(YamlTest, YamlErrorNamesTheLineOfTheNode) {
  const std::string path = Write("a: 1\nb: two\n");
  auto y = LoadYamlFile(path);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(YamlError(path, y.value()["b"], "b must be a number").message(), path + ":2: b must be a number");
  EXPECT_EQ(YamlError(path, y.value()["c"], "missing field 'c'").message(), path + ": missing field 'c'");
}

}  // namespace
}  // namespace eldr
