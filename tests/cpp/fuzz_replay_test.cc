// Every fuzz target (tests/fuzz) on every input of its corpus, and on every input once found
// failing: what libFuzzer found stays found. `make fuzz` grows the corpora.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "../../csrc/core/base/sparse_block.h"
#include "../../csrc/core/base/tag.h"
#include "../../csrc/core/base/wire.h"
#include "../../csrc/core/group/window.h"
#include "../fuzz/fuzz.h"
#include "harness.h"

namespace ddl::fuzz {

std::map<std::string, Target>& targets() {
  static std::map<std::string, Target> all;
  return all;
}

bool add(const char* name, Target target) {
  targets()[name] = target;
  return true;
}

}  // namespace ddl::fuzz

namespace ddl::test {
namespace {

namespace fs = std::filesystem;

std::string corpusRoot() {
  const char* root = std::getenv("DDL_FUZZ_CORPUS");
  return root != nullptr ? root : "tests/fuzz/corpus";
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(Fuzz, EveryTargetHasACorpus) {
  ASSERT_GE(fuzz::targets().size(), 8u);
  for (const auto& [name, target] : fuzz::targets()) {
    const fs::path dir = fs::path(corpusRoot()) / name;
    ASSERT_TRUE(fs::is_directory(dir)) << dir << " (run from the repository's root)";
    EXPECT_FALSE(fs::is_empty(dir)) << dir;
  }
}

TEST(Fuzz, CorporaReplay) {
  size_t inputs = 0;
  for (const auto& [name, target] : fuzz::targets()) {
    for (const std::string& kind : {std::string("corpus"), std::string("crashes")}) {
      const fs::path dir = fs::path(corpusRoot()).parent_path() / kind / name;
      if (!fs::is_directory(dir)) continue;
      for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string input = readFile(entry.path());
        try {
          target(reinterpret_cast<const uint8_t*>(input.data()), input.size());
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << " on " << entry.path() << ": " << e.what();
        }
        ++inputs;
      }
    }
  }
  std::printf("%zu inputs of %zu targets replayed\n", inputs, fuzz::targets().size());
}

// DDL_FUZZ_WRITE_SEEDS=1: writes each target's seeds (real encodings) into its corpus.
TEST(Fuzz, WriteSeeds) {
  if (std::getenv("DDL_FUZZ_WRITE_SEEDS") == nullptr) GTEST_SKIP() << "only when asked";
  auto write = [](const std::string& target, const std::string& name, const std::string& bytes) {
    const fs::path dir = fs::path(corpusRoot()) / target;
    fs::create_directories(dir);
    std::ofstream(dir / ("seed-" + name), std::ios::binary) << bytes;
  };
  std::vector<RankCard> cards(2);
  cards[0].address = "address of rank 0";
  cards[0].locality = Locality{"host-a", "boot/net:[1]/shm:2"}.encode();
  cards[1].rank = 1;
  cards[1].address = "address of rank 1";
  cards[1].locality = Locality{"host-b", "boot/net:[1]/shm:2"}.encode();
  write("bootstrap", "cards", std::string(1, '\0') + encodeCards(cards));
  // 8 ranks (the first byte: 4 x 7 + its kind) in hosts of 4 and 2 x 2.
  Span span = Span::of(0, false, false, false, false, "");
  for (int r = 1; r < 8; ++r) span.append(Span::of(r, r != 4 && r != 6, false, false, false, ""));
  write("bootstrap", "span", std::string(1, static_cast<char>(4 * 7 + 2)) + encodeSpan(span));
  write("bootstrap", "machine",
        std::string(1, static_cast<char>(4 * 7 + 1)) + encodeMachine(machineFrom(span, 8, 3, {})));
  write("bootstrap", "entries",
        std::string(1, static_cast<char>(4 * 7 + 3)) + encodeEntries({{2, "address of rank 2"}}));
  std::vector<DeriveCard> derive(2);
  derive[0].request = "exclude 2";
  derive[0].heldIds = std::string(tag::kMaxGroups, '\0');
  derive[1].rank = derive[1].parentRank = 1;
  derive[1].request = "exclude 2";
  write("agreement", "cards", encodeCards(derive));
  Notice n;
  n.sequence = 12;
  n.incarnation = 99;
  n.type = Notice::Type::kNews;
  n.from = 1;
  n.gone = {3, 4, 5, 9};
  n.text = "rank 3 is gone";
  write("notice", "news", n.encode());
  const CallPrint p = callPrint(Collective::kReduce, 7, DataType::kInt64, ReduceOp::kMax, 2);
  write("call_print", "reduce", std::string(reinterpret_cast<const char*>(&p), sizeof(p)));
  WindowOffer o;
  o.layout = "float32 [16] on cpu";
  o.share = "a share key";
  o.header = {64, 0, static_cast<uint32_t>(o.layout.size()), static_cast<uint32_t>(o.share.size()),
              0,  0};
  write("window_offer", "offer", encodeWindowOffer(o));
  // A handle as Derivation::handle writes it (after its prefix), of a made-up process.
  const Locality where{"host-a", "boot/net:[4026531833]/shm:27"};
  Writer w;
  w.text("loopback:3");
  w.text("");
  w.text(where.encode());
  w.text("TORCH_DDL_STAGED_BYTES=4096\n");
  w.number(1);
  std::string hex;
  for (unsigned char c : w.take()) {
    hex.push_back("0123456789abcdef"[c >> 4]);
    hex.push_back("0123456789abcdef"[c & 15]);
  }
  write("handle", "handle", hex);
  write("handle", "locality", where.encode());
  write("store_value", "id", "17");
  std::vector<int64_t> header{2, 0, 6, 2, 5, 7, 1, 0, 4};
  std::string block(reinterpret_cast<const char*>(header.data()), header.size() * 8);
  block += std::string(4, '\0');
  write("sparse", "block", std::string(1, '\0') + block);  // float32: 4-byte values
}

}  // namespace
}  // namespace ddl::test
