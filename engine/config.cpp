#include "engine/config.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "data/utf8.h"
#include "engine/device_select.h"
#include "engine/stage_schedule.h"

namespace engine {

namespace {

template <typename T>
const char* type_name();
template <>
const char* type_name<int64_t>() {
  return "int";
}
template <>
const char* type_name<double>() {
  return "float";
}
template <>
const char* type_name<bool>() {
  return "bool";
}
template <>
const char* type_name<std::string>() {
  return "string";
}

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest text that reads back exactly
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string value_string(const FieldValue& v) {
  if (auto p = std::get_if<int64_t*>(&v)) return std::to_string(**p);
  if (auto p = std::get_if<double*>(&v)) return format_double(**p);
  if (auto p = std::get_if<bool*>(&v)) return **p ? "true" : "false";
  return *std::get<std::string*>(v);
}

std::vector<FieldInfo> make_fields() {
  std::vector<FieldInfo> fields;
#define ENGINE_CONFIG_ENTRY(section, type, member, key, def, required, doc)          \
  fields.push_back(FieldInfo{#section "." key, type_name<type>(), "", required, doc, \
                             [](Config& c) -> FieldValue { return &c.section.member; }});
#define ENGINE_CONFIG_TOP_ENTRY(section, type, member, key, def, required, doc) \
  fields.push_back(FieldInfo{key, type_name<type>(), "", required, doc,         \
                             [](Config& c) -> FieldValue { return &c.member; }});
  ENGINE_TOP_FIELDS(ENGINE_CONFIG_TOP_ENTRY)
#undef ENGINE_CONFIG_TOP_ENTRY
  ENGINE_MODEL_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_DATA_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_TRAIN_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_ZERO_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_CHECKPOINT_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_COMM_FIELDS(ENGINE_CONFIG_ENTRY)
  ENGINE_LOG_FIELDS(ENGINE_CONFIG_ENTRY)
#undef ENGINE_CONFIG_ENTRY
  Config defaults;
  for (auto& f : fields)
    f.default_value = value_string(f.get(defaults));
  return fields;
}

std::optional<int64_t> parse_positive(std::string_view text) {
  int64_t v = 0;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || res.ec != std::errc() || res.ptr != text.data() + text.size() || v < 1)
    return std::nullopt;
  return v;
}

const FieldInfo* find_field(const std::string& key) {
  for (const auto& f : config_fields())
    if (f.key == key) return &f;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A config is small: its text, its nodes once aliases are expanded, and its nesting are bounded,
// so that a hostile file (an alias bomb, ten thousand nested lists, a disk image) is refused with
// its limit instead of exhausting memory or the stack. The real configs are a few kB, 200 nodes
// and 5 levels deep.
constexpr size_t kMaxConfigBytes = 1 << 20;
constexpr size_t kMaxConfigNodes = 100'000;
constexpr size_t kMaxConfigDepth = 64;

// The smallest comm.timeout_s (seconds) besides 0 (off).
constexpr double kMinCommTimeoutS = 1.0;

// User input echoed in a message, cut to a readable length (an overlong --set value was printed
// whole, twice, in one line of 200k characters); the cut backs off to a UTF-8 boundary.
std::string shown(const std::string& text) {
  constexpr size_t kShown = 80;
  if (text.size() <= kShown) return text;
  size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return text.substr(0, cut) + "... (" + std::to_string(text.size()) + " bytes)";
}

// The escape of the character that starts at key[i] outside printable ASCII: \u{430} for a
// code point, \xNN for a byte that starts none; `length` is set to the bytes it covers.
std::string escaped_char(const std::string& key, size_t i, size_t& length) {
  const auto c = static_cast<unsigned char>(key[i]);
  const size_t extra = c >= 0xF0 && c < 0xF8 ? 3 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xC0 ? 1 : 0;
  uint32_t code = extra == 3 ? c & 0x07u : extra == 2 ? c & 0x0Fu : c & 0x1Fu;
  bool whole = extra > 0 && i + extra < key.size();
  for (size_t k = 1; whole && k <= extra; ++k) {
    const auto next = static_cast<unsigned char>(key[i + k]);
    whole = (next & 0xC0) == 0x80;
    code = (code << 6) | (next & 0x3Fu);
  }
  char buf[16];
  if (whole) {
    std::snprintf(buf, sizeof(buf), "\\u{%X}", code);
    length = extra + 1;
  } else {
    std::snprintf(buf, sizeof(buf), "\\x%02X", c);
    length = 1;
  }
  return buf;
}

bool printable_ascii(char c) {
  return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
}

// A key as echoed in a message: cut as shown() does, every character outside printable ASCII
// escaped, so that a look-alike letter (Cyrillic 'а' for 'a') does not read as the key it
// imitates, and a suggestion never reads as the same key.
std::string shown_key(const std::string& key) {
  std::string out;
  for (size_t i = 0, length = 1; i < key.size(); i += length) {
    length = 1;
    out += printable_ascii(key[i]) ? std::string(1, key[i]) : escaped_char(key, i, length);
  }
  return shown(out);
}

// "; it holds \u{430}, ..." for a key with a character outside printable ASCII, whose look-alike
// letters would otherwise read as a known key; "" for an ASCII key.
std::string non_ascii_note(const std::string& key) {
  const auto it = std::find_if(key.begin(), key.end(), [](char c) { return !printable_ascii(c); });
  if (it == key.end()) return "";
  size_t length = 1;
  return "; it holds " + escaped_char(key, static_cast<size_t>(it - key.begin()), length) +
         ", no printable ASCII character: config keys are ASCII (a look-alike letter typed or "
         "pasted?)";
}

// " (did you mean 'x'?)" for the closest known key, when it is close enough to be a typo.
std::string did_you_mean(const std::string& key) {
  if (key.size() > 100) return "";  // no key is this long, and the distances would cost seconds
  std::string best;
  size_t best_d = std::string::npos;
  auto consider = [&](const std::string& candidate) {
    size_t d = edit_distance(key, candidate);
    if (d < best_d) best_d = d, best = candidate;
  };
  for (const auto& f : config_fields())
    consider(f.key);
  consider("optim");
  // A key whose last part is right but sits in the wrong section also counts.
  auto leaf = key.substr(key.rfind('.') + 1);
  for (const auto& f : config_fields())
    if (f.key.substr(f.key.rfind('.') + 1) == leaf && best_d > 1) best_d = 1, best = f.key;
  if (best_d <= std::max<size_t>(2, key.size() / 4)) return " (did you mean '" + best + "'?)";
  return "";
}

std::string where(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1);
}

[[noreturn]] void config_error(const std::string& at, const std::string& message) {
  throw core::Error("config error: " + at + ": " + message);
}

// Parses a scalar's text with the field's type; returns an explanation when it does not fit.
std::string assign(const FieldValue& target, const std::string& text) {
  if (auto p = std::get_if<int64_t*>(&target)) {
    int64_t v = 0;
    auto res = std::from_chars(text.data(), text.data() + text.size(), v);
    if (res.ec != std::errc() || res.ptr != text.data() + text.size() || text.empty())
      return "expected an integer, got '" + shown(text) + "'";
    **p = v;
  } else if (auto p = std::get_if<double*>(&target)) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
      return "expected a finite number, got '" + shown(text) + "'";
    **p = v;
  } else if (auto p = std::get_if<bool*>(&target)) {
    if (text == "true" || text == "True" || text == "TRUE") {
      **p = true;
    } else if (text == "false" || text == "False" || text == "FALSE") {
      **p = false;
    } else {
      return "expected true or false, got '" + shown(text) + "'";
    }
  } else {
    *std::get<std::string*>(target) = text;
  }
  return "";
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.'))
    parts.push_back(part);
  return parts;
}

void parse_optim_groups(Config& config, const YAML::Node& node, const std::string& source);

// yaml-cpp reads a merge key ('<<: *defaults') as a key named "<<", so its keys were refused as
// an unknown key '<<' (or, in a parameter group, an unknown hyperparameter).
[[noreturn]] void refuse_merge_key(const std::string& at) {
  config_error(at,
               "YAML merge keys ('<<: *name') are not supported: write the keys out (an alias "
               "of a whole value, 'key: *name', works)");
}

// Walks a YAML map, assigning every scalar leaf to its field; `seen` collects the keys set.
void parse_map(Config& config, const YAML::Node& node, const std::string& prefix,
               const std::string& source, std::vector<std::string>& seen) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: it-> is a proxy whose members do not outlive the expression.
    const YAML::Node key_node = it->first;
    const YAML::Node value = it->second;
    if (!key_node.IsScalar())
      config_error(where(source, key_node.Mark()), "keys must be plain names");
    if (key_node.Scalar() == "<<") refuse_merge_key(where(source, key_node.Mark()));
    std::string key = prefix.empty() ? key_node.Scalar() : prefix + "." + key_node.Scalar();
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      config_error(where(source, key_node.Mark()), "key '" + shown(key) + "' is given twice");
    if (key == "optim") {
      parse_optim_groups(config, value, source);
      config.origins[key] = where(source, value.Mark());
      seen.push_back(key);
      continue;
    }
    const FieldInfo* field = find_field(key);
    if (field == nullptr) {
      // A section (or a nested group such as model.moe) is a map of known keys.
      bool is_prefix = false;
      for (const auto& f : config_fields())
        if (f.key.rfind(key + ".", 0) == 0) is_prefix = true;
      if (is_prefix) {
        if (value.IsNull()) continue;  // an empty section keeps its defaults
        if (!value.IsMap())
          config_error(where(source, value.Mark()),
                       "'" + key + "' is a section: expected a map of keys");
        parse_map(config, value, key, source, seen);
        continue;
      }
      config_error(where(source, key_node.Mark()), "unknown key '" + shown_key(key) + "'" +
                                                       did_you_mean(key) + non_ascii_note(key));
    }
    if (value.IsNull()) config_error(where(source, value.Mark()), "key '" + key + "' has no value");
    if (!value.IsScalar())
      config_error(where(source, value.Mark()), "key '" + key + "' has the wrong type: expected " +
                                                    field->type + ", got a " +
                                                    (value.IsMap() ? "map" : "list"));
    std::string why = assign(field->get(config), value.Scalar());
    if (!why.empty())
      config_error(where(source, value.Mark()), "key '" + key + "' has the wrong type: " + why);
    config.origins[key] = where(source, value.Mark());
    seen.push_back(key);
  }
}

// What a scan of one YAML document saw: where it starts and its first value that is not null.
// It also counts the nodes the document holds with every alias expanded (an alias stands for
// all the nodes under its anchor, so nested anchors multiply at each level: the "billion laughs")
// and its nesting depth, and refuses the document past kMaxConfigNodes or kMaxConfigDepth.
class DocumentScan : public YAML::EventHandler {
 public:
  explicit DocumentScan(std::string source) : source_(std::move(source)) {}

  YAML::Mark start;
  std::optional<YAML::Mark> content;

  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    content.reset();
    anchored_.clear();
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    seen(mark);
    const auto it = anchored_.find(anchor);
    count(mark, it == anchored_.end() ? 1 : it->second);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    seen(mark);
    leaf(mark, anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    seen(mark);
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    seen(mark);
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  void seen(const YAML::Mark& mark) {
    if (!content) content = mark;
  }
  void count(const YAML::Mark& mark, size_t nodes) {
    nodes_ += nodes;
    if (nodes_ > kMaxConfigNodes)
      config_error(where(source_, mark),
                   "the document expands to more than " + std::to_string(kMaxConfigNodes) +
                       " nodes (aliases of nested anchors?): a config is small");
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    count(mark, 1);
    if (anchor != YAML::NullAnchor) anchored_[anchor] = 1;
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (open_.size() >= kMaxConfigDepth)
      config_error(where(source_, mark), "nested more than " + std::to_string(kMaxConfigDepth) +
                                             " levels deep: a config is small");
    open_.push_back({anchor, nodes_});
    count(mark, 1);
  }
  void close() {
    const auto [anchor, nodes_before] = open_.back();
    open_.pop_back();
    if (anchor != YAML::NullAnchor) anchored_[anchor] = nodes_ - nodes_before;
  }

  std::string source_;
  size_t nodes_ = 0;                                     // over all documents read so far
  std::vector<std::pair<YAML::anchor_t, size_t>> open_;  // open collections: anchor, nodes_
  std::map<YAML::anchor_t, size_t> anchored_;            // nodes under each anchor
};

// The text of a config: bounded in size, and text (a NUL byte cut a quoted value short without
// a word, and invalid UTF-8 reached the printed config); refusals name the line.
void check_config_text(const std::string& text, const std::string& source) {
  if (text.size() > kMaxConfigBytes)
    config_error(source, "is " + std::to_string(text.size()) + " bytes, more than a config's " +
                             std::to_string(kMaxConfigBytes) + ": a config is small");
  const auto line_of = [&](size_t offset) {
    return source + ":" + std::to_string(1 + std::count(text.begin(), text.begin() + offset, '\n'));
  };
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    config_error(line_of(nul),
                 "a NUL byte (at byte " + std::to_string(nul) + "): a config is text");
  if (const size_t bad = data::find_invalid_utf8(text); bad != data::kUtf8Valid)
    config_error(line_of(bad), "invalid UTF-8 at byte " + std::to_string(bad));
}

// The documents of `text`, scanned for the checks of single_document and the bounds of
// DocumentScan; throws YAML::ParserException for a syntax error.
void scan_documents(const std::string& text, const std::string& source) {
  check_config_text(text, source);
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentScan scan(source);
  std::optional<YAML::Mark> previous_start;
  for (int index = 0; parser.HandleNextDocument(scan); ++index) {
    if (previous_start && previous_start->pos == scan.start.pos)
      config_error(where(source, scan.start),
                   "YAML syntax error: the parser cannot get past this point (a stray ',', '}' "
                   "or ']' outside a flow collection?)");
    previous_start = scan.start;
    if (index > 0 && scan.content)
      config_error(where(source, *scan.content),
                   "a second YAML document (after a '---' line): a config is one document; "
                   "merge its keys into the first or use another file");
  }
}

// The one YAML document of a config. YAML::Load reads only the first, so the keys of a second
// one (after a `---` line) would be dropped without a word: refused, naming its line. The
// documents are scanned here rather than by YAML::LoadAll, which never returns on a text such as
// ", a: 1" (yaml-cpp 0.7 hands back an empty document at the stray ',' without consuming it,
// forever, and the list of documents grows until memory runs out): a document that starts where
// the one before it started is refused as the syntax error it is.
YAML::Node single_document(const std::string& text, const std::string& source) {
  try {
    scan_documents(text, source);
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    config_error(where(source, e.mark), "YAML syntax error: " + e.msg);
  }
}

YAML::Node load_yaml_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    config_error(path, "is a directory, not a YAML file (give the config file, e.g. " +
                           (std::filesystem::path(path) / "tiny.yaml").string() + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    config_error(path,
                 std::string("cannot open the file: ") +
                     (std::filesystem::exists(path, ec) ? std::strerror(errno) : "no such file"));
  // One byte past the limit is enough to refuse (a device such as /dev/zero never ends).
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) config_error(path, std::string("cannot read the file: ") + std::strerror(errno));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    config_error(path,
                 "is more than " + std::to_string(kMaxConfigBytes) + " bytes: a config is small");
  return single_document(text, path);
}

// One parameter group of the list, the i-th (from 0), read from `source`. A group changed by a
// --set (optim.<i>.<key>=...) is read again with `set_at`, the --set argument, which its
// refusals then name (they named the file's line of the group).
OptimGroup parse_optim_group(const YAML::Node& g, size_t i, const std::string& source,
                             const std::string& set_at = "") {
  const auto where = [&](const std::string& file, const YAML::Mark& mark) {
    return set_at.empty() ? engine::where(file, mark) : set_at;
  };
  std::string at = where(source, g.Mark());
  std::string name = "optim[" + std::to_string(i) + "]";
  if (!g.IsMap()) config_error(at, name + " must be a map with 'params' and 'optimizer'");
  // yaml-cpp keeps both of a key given twice and a lookup finds the first: the second was
  // dropped without a word.
  std::vector<std::string> keys;
  for (auto it = g.begin(); it != g.end(); ++it) {
    const YAML::Node key = it->first;
    const std::string text = key.IsScalar() ? key.Scalar() : std::string();
    if (text == "<<") refuse_merge_key(where(source, key.Mark()));
    // A group's keys go to its optimizer, which names unknown ones later; a key that cannot be a
    // hyperparameter's name is refused here, where its line is known. (One of control characters
    // and 600 bytes passed and then broke the effective config's YAML: a key past 1024
    // characters once escaped cannot be written as a plain map key.)
    const bool plain =
        !text.empty() && text.size() <= 64 && std::all_of(text.begin(), text.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        });
    if (!plain)
      config_error(where(source, key.Mark()),
                   name + ": key '" + shown_key(text) +
                       "' is not a hyperparameter name (letters, digits and '_', at most 64)" +
                       non_ascii_note(text));
    if (std::find(keys.begin(), keys.end(), text) != keys.end())
      config_error(where(source, key.Mark()),
                   name + ": key '" + shown_key(text) + "' is given twice");
    keys.push_back(text);
  }
  OptimGroup group;
  group.node = g;
  group.file = source;
  group.line = g.Mark().line + 1;
  const YAML::Node params = g["params"];
  if (!params) config_error(at, "missing required key '" + name + ".params'");
  if (params.IsScalar()) {
    group.params.push_back(params.Scalar());
  } else if (params.IsSequence() && params.size() > 0) {
    for (const auto& p : params) {
      if (!p.IsScalar())
        config_error(where(source, p.Mark()), name + ".params must be a list of name globs");
      group.params.push_back(p.Scalar());
    }
  } else {
    config_error(where(source, params.Mark()),
                 name + ".params must be a glob or a non-empty list of globs");
  }
  const YAML::Node opt = g["optimizer"];
  if (!opt) config_error(at, "missing required key '" + name + ".optimizer'");
  if (!opt.IsScalar() || opt.Scalar().empty())
    config_error(where(source, opt.Mark()), name + ".optimizer must be an optimizer name");
  group.optimizer = opt.Scalar();
  return group;
}

// `optim` is the list of groups, a map {groups: list}, or the path of a YAML file (relative to
// the config's folder) whose `optim` key is one of those, e.g. a preset under configs/presets/.
void parse_optim_groups(Config& config, const YAML::Node& node, const std::string& source) {
  if (node.IsScalar()) {
    std::filesystem::path preset = node.Scalar();
    if (preset.is_relative()) preset = std::filesystem::path(source).parent_path() / preset;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(preset, ec))
      config_error(where(source, node.Mark()),
                   "'optim' is '" + shown(node.Scalar()) +
                       "': expected a list of parameter groups ({params: [globs], optimizer: "
                       "name, ...}) or the path of a preset file, but there is no file " +
                       preset.string());
    YAML::Node root = load_yaml_file(preset.string());
    if (!root.IsMap() || !root["optim"])
      config_error(where(source, node.Mark()),
                   "optim preset '" + preset.string() + "' has no top-level 'optim' list");
    parse_optim_groups(config, root["optim"], preset.string());
    return;
  }
  if (node.IsMap()) {
    // The preset form: `optim: {groups: [...]}`.
    for (auto it = node.begin(); it != node.end(); ++it)
      if (it->first.Scalar() != "groups")
        config_error(where(source, it->first.Mark()), "unknown key 'optim." +
                                                          shown_key(it->first.Scalar()) +
                                                          "' (did you mean 'optim.groups'?)");
    if (node["groups"]) {
      parse_optim_groups(config, node["groups"], source);
      return;
    }
  }
  if (!node.IsSequence() || node.size() == 0)
    config_error(where(source, node.Mark()),
                 "'optim' must be a non-empty list of parameter groups "
                 "({params: [globs], optimizer: name, ...}) or the path of a preset file");
  config.optim.clear();
  for (size_t i = 0; i < node.size(); ++i)
    config.optim.push_back(parse_optim_group(node[i], i, source));
}

// optim.<i>.<key>=value (a list index, as Hydra and OmegaConf allow): sets one key of parameter
// group i, counted from 0 (a nested key such as optim.0.matrix_views.qkv too); the group is read
// again as a whole, so a changed params or optimizer is checked as in a file.
void set_optim_group_key(Config& config, const std::string& key, const std::string& text,
                         const std::string& at) {
  const std::vector<std::string> parts = split_key(key);
  const std::string index = parts.size() > 1 ? parts[1] : "";
  if (parts.size() < 3 || index.empty() || index.size() > 9 ||
      index.find_first_not_of("0123456789") != std::string::npos)
    config_error(at, "unknown key '" + key +
                         "': a key of a parameter group is optim.<index>.<key>, the groups "
                         "counted from 0 (e.g. optim.0.lr=0.01)");
  const size_t i = std::stoul(index);
  if (i >= config.optim.size())
    config_error(at, "there is no parameter group " + index + ": optim has " +
                         std::to_string(config.optim.size()) + " (optim.0 to optim." +
                         std::to_string(config.optim.size() - 1) + ")");
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    config_error(at, "the value is not valid YAML: " + e.msg);
  }
  YAML::Node node = config.optim[i].node;
  for (size_t k = 2; k + 1 < parts.size(); ++k) {
    YAML::Node child = node[parts[k]];  // a handle: constructed, never assigned (that would copy)
    node.reset(child);
  }
  node[parts.back()] = value;
  const OptimGroup& old = config.optim[i];
  OptimGroup group = parse_optim_group(old.node, i, old.file, at);
  group.line = old.line;
  config.optim[i] = std::move(group);
}

Config parse_root(const YAML::Node& root, const std::string& source,
                  const std::vector<std::string>& overrides, ConfigUse use) {
  Config config;
  config.source = source;
  std::vector<std::string> seen;
  if (!root.IsNull()) {
    if (!root.IsMap()) config_error(source, "the top level must be a map of sections");
    parse_map(config, root, "", source, seen);
  }
  for (const auto& o : overrides) {
    apply_override(config, o);
    seen.push_back(o.substr(0, o.find('=')));
  }
  const bool training = use == ConfigUse::Training;
  for (const auto& f : config_fields())
    if (f.required && (training || f.key.starts_with("model.")) &&
        std::find(seen.begin(), seen.end(), f.key) == seen.end())
      config_error(source, "missing required key '" + f.key + "' (" + f.doc + ")");
  if (training && config.optim.empty())
    config_error(source, "missing required key 'optim' (the list of parameter groups)");
  validate_config(config, use);
  return config;
}

}  // namespace

const std::vector<FieldInfo>& config_fields() {
  static const std::vector<FieldInfo> fields = make_fields();
  return fields;
}

std::string field_value_string(const Config& config, const FieldInfo& field) {
  return value_string(field.get(const_cast<Config&>(config)));
}

void apply_override(Config& config, const std::string& assignment) {
  const std::string at = "--set " + shown(assignment);
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    config_error(at, "an override has the form key=value, e.g. train.steps=100");
  std::string key = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  if (key == "optim") {
    YAML::Node node;
    try {
      scan_documents(text, at);
      node = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      config_error(at, "the value is not valid YAML: " + e.msg);
    }
    parse_optim_groups(config, node, "--set optim");
    config.origins[key] = at;
    return;
  }
  if (key.starts_with("optim.")) {
    set_optim_group_key(config, key, text, at);
    config.origins[key] = at;
    return;
  }
  const FieldInfo* field = find_field(key);
  if (field == nullptr)
    config_error(at,
                 "unknown key '" + shown_key(key) + "'" + did_you_mean(key) + non_ascii_note(key));
  // A list or map is refused as in a YAML file (it used to become a literal string).
  YAML::Node parsed;
  try {
    parsed = YAML::Load(text);
  } catch (const YAML::Exception&) {  // not YAML: the text itself is the value
  }
  if (parsed.IsSequence() || parsed.IsMap())
    config_error(at, "key '" + key + "' has the wrong type: expected " + field->type + ", got a " +
                         (parsed.IsMap() ? "map" : "list"));
  // A quoted value means what it does in a file: model.window_pattern="" is empty (its quotes
  // used to become the value).
  if (parsed.IsScalar() && !text.empty() && (text.front() == '"' || text.front() == '\''))
    text = parsed.Scalar();
  std::string why = assign(field->get(config), text);
  if (!why.empty()) config_error(at, "key '" + key + "' has the wrong type: " + why);
  config.origins[key] = at;
}

std::string config_origin(const Config& config, const std::string& key) {
  if (auto it = config.origins.find(key); it != config.origins.end()) return it->second;
  return config.source.empty() ? "config" : config.source;
}

std::optional<std::vector<int>> parse_block_list(const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && text[i] == ' ')
      ++i;
  };
  skip_space();
  if (i == text.size()) return out;
  while (true) {
    skip_space();
    int value = 0;
    const auto res = std::from_chars(text.data() + i, text.data() + text.size(), value);
    if (res.ec != std::errc() || value < 0) return std::nullopt;
    out.push_back(value);
    i = static_cast<size_t>(res.ptr - text.data());
    skip_space();
    if (i == text.size()) return out;
    if (text[i] != ',') return std::nullopt;
    ++i;
  }
}

std::optional<std::pair<int64_t, int64_t>> parse_step_range(const std::string& text) {
  const size_t dash = text.find('-');
  const std::string_view all(text);
  const std::optional<int64_t> first = parse_positive(all.substr(0, dash));
  const std::optional<int64_t> last =
      dash == std::string::npos ? first : parse_positive(all.substr(dash + 1));
  if (!first || !last || *last < *first) return std::nullopt;
  return std::make_pair(*first, *last);
}

void validate_config(const Config& c, ConfigUse use) {
  auto fail = [&](const std::string& key, const std::string& message) {
    config_error(config_origin(c, key), "key '" + key + "': " + message);
  };
  if (!is_device_mode(c.device))
    fail("device", "must be auto, cpu or cuda, got '" + shown(c.device) + "'");
  if (c.model.arch != "gpt2" && c.model.arch != "modern")
    fail("model.arch", "must be gpt2 or modern, got '" + shown(c.model.arch) + "'");
  // The model keeps its sizes in int; a size beyond that is a typo, not a model.
  for (const auto& [key, value] :
       {std::pair<const char*, int64_t>{"model.n_layer", c.model.n_layer},
        {"model.n_head", c.model.n_head},
        {"model.d_model", c.model.d_model},
        {"model.seq_len", c.model.seq_len},
        {"model.moe.experts", c.model.moe_experts},
        {"model.moe.top_k", c.model.moe_top_k}})
    if (value > std::numeric_limits<int32_t>::max())
      fail(key, "is " + std::to_string(value) + ", above the largest model size 2^31 - 1");
  if (c.model.n_layer < 1) fail("model.n_layer", "must be >= 1");
  if (c.model.n_head < 1) fail("model.n_head", "must be >= 1");
  if (c.model.d_model < 1 || c.model.d_model % c.model.n_head != 0)
    fail("model.d_model",
         "must be a positive multiple of model.n_head = " + std::to_string(c.model.n_head));
  if (c.model.arch == "modern" && (c.model.d_model / c.model.n_head) % 2 != 0)
    fail("model.d_model", "rotary positions need an even head size d_model / n_head");
  if (c.model.seq_len < 1) fail("model.seq_len", "must be >= 1");
  if (c.model.vocab_size < 2 || c.model.vocab_size > 65536)
    fail("model.vocab_size", "must be in [2, 65536] (token shards store uint16 ids)");
  if (c.model.softcap < 0) fail("model.softcap", "must be >= 0");
  if (c.model.moe_experts < 0) fail("model.moe.experts", "must be >= 0");
  if (c.model.mlp_fp8 && c.model.moe_experts > 0)
    fail("model.mlp_fp8", "runs the dense MLP's GEMMs in FP8: it cannot go with model.moe");
  if (c.model.moe_experts > 0 && (c.model.moe_top_k < 1 || c.model.moe_top_k > c.model.moe_experts))
    fail("model.moe.top_k", "must be in [1, model.moe.experts]");
  if (c.model.vocab_pad < 1 || c.model.vocab_pad > 4096)
    fail("model.vocab_pad", "must be in [1, 4096]");
  if (c.model.softcap_form != "tanh" && c.model.softcap_form != "sigmoid")
    fail("model.softcap_form",
         "must be tanh or sigmoid, got '" + shown(c.model.softcap_form) + "'");
  if (c.model.softcap_form == "sigmoid" && c.model.softcap <= 0)
    fail("model.softcap", "must be positive with model.softcap_form sigmoid");
  if (c.model.softcap_form == "sigmoid" && c.model.softcap_scale <= 0)
    fail("model.softcap_scale", "must be positive with model.softcap_form sigmoid");
  if (c.model.softcap_offset != 0 && c.model.softcap_form != "sigmoid")
    fail("model.softcap_offset", "needs model.softcap_form sigmoid");
  if (c.model.softcap_offset != 0 && c.train.precision == "bf16" && !c.model.head_fp8)
    fail("model.softcap_offset",
         "needs f32 logits: train.precision fp32 or tf32, or model.head_fp8 (its logits are f32)");
  if (c.model.attn_scale < 0) fail("model.attn_scale", "must be >= 0 (0: 1/sqrt(head size))");
  const auto no_attn = parse_block_list(c.model.no_attn_layers);
  if (!no_attn)
    fail("model.no_attn_layers",
         "must be a comma list of block indices, got '" + shown(c.model.no_attn_layers) + "'");
  for (int l : *no_attn)
    if (l >= c.model.n_layer)
      fail("model.no_attn_layers",
           "block " + std::to_string(l) +
               " is outside [0, model.n_layer = " + std::to_string(c.model.n_layer) + ")");
  const auto ve_layers = parse_block_list(c.model.value_embed_layers);
  if (!ve_layers)
    fail("model.value_embed_layers",
         "must be a comma list of block indices, got '" + shown(c.model.value_embed_layers) + "'");
  if (!ve_layers->empty() && c.model.value_embeds != 0 &&
      c.model.value_embeds != static_cast<int64_t>(ve_layers->size()))
    fail("model.value_embed_layers",
         "places one table per named block: model.value_embeds must be 0 or their count, got " +
             std::to_string(c.model.value_embeds));
  for (int l : *ve_layers)
    if (l >= c.model.n_layer || std::find(no_attn->begin(), no_attn->end(), l) != no_attn->end() ||
        std::count(ve_layers->begin(), ve_layers->end(), l) != 1)
      fail("model.value_embed_layers", "block " + std::to_string(l) +
                                           " must be an attention block below model.n_layer = " +
                                           std::to_string(c.model.n_layer) + ", named once");
  // Record #89's per-block attention keys: comma lists of attention blocks.
  auto attention_blocks = [&](const char* key, const std::string& text) {
    const auto blocks = parse_block_list(text);
    if (!blocks) fail(key, "must be a comma list of block indices, got '" + shown(text) + "'");
    for (int l : *blocks)
      if (l >= c.model.n_layer || std::find(no_attn->begin(), no_attn->end(), l) != no_attn->end())
        fail(key, "block " + std::to_string(l) +
                      " is not an attention block of [0, model.n_layer = " +
                      std::to_string(c.model.n_layer) + ")");
    return *blocks;
  };
  const auto paired = attention_blocks("model.paired_head_layers", c.model.paired_head_layers);
  const auto xsa = attention_blocks("model.xsa_layers", c.model.xsa_layers);
  const auto gates = attention_blocks("model.attn_gate_layers", c.model.attn_gate_layers);
  for (int l : xsa)
    if (std::find(paired.begin(), paired.end(), l) != paired.end())
      fail("model.xsa_layers", "block " + std::to_string(l) +
                                   " has paired heads (model.paired_head_layers): the record's "
                                   "XSA is for unpaired blocks only");
  if (!paired.empty() && c.model.n_head % 2 != 0)
    fail("model.paired_head_layers", "pairs head h with h + n_head / 2: model.n_head must be even");
  if (!paired.empty() && c.model.window_block != 0)
    fail("model.paired_head_layers",
         "the paired blocks take a token-granular window on the interleaved sequence: needs "
         "model.window_block 0");
  if (c.model.value_embeds < 0 ||
      (ve_layers->empty() && 2 * c.model.value_embeds > c.model.n_layer))
    fail("model.value_embeds",
         "must be in [0, model.n_layer / 2] (the first n and the last n "
         "blocks use the tables), got " +
             std::to_string(c.model.value_embeds));
  // The record's parts are written for the modern block.
  if (c.model.arch != "modern") {
    for (const auto& [key, on] :
         {std::pair<const char*, bool>{"model.attn_scale", c.model.attn_scale > 0},
          {"model.no_attn_layers", !no_attn->empty()},
          {"model.value_embeds", c.model.value_embeds > 0},
          {"model.value_embed_layers", !ve_layers->empty()},
          {"model.unet_skips", c.model.unet_skips},
          {"model.x0_lambdas", c.model.x0_lambdas},
          {"model.zero_init_head", c.model.zero_init_head},
          {"model.softcap_form", c.model.softcap_form != "tanh"},
          {"model.doc_bos", c.model.doc_bos >= 0},
          {"model.window", c.model.window > 0},
          {"model.x0_norm", c.model.x0_norm},
          {"model.norm_eps", c.model.norm_eps != 1e-6},
          {"model.rotary_base", c.model.rotary_base != 10000.0},
          {"model.rotary_truncate", c.model.rotary_truncate},
          {"model.v_lambdas_all", c.model.v_lambdas_all},
          {"model.uniform_matrix_init", c.model.uniform_matrix_init},
          {"model.head_fp8", c.model.head_fp8},
          {"model.mlp_fp8", c.model.mlp_fp8},
          {"model.key_offset", c.model.key_offset},
          {"model.bigram_rows", c.model.bigram_rows != 0},
          {"model.smear", c.model.smear},
          {"model.sublayer_lambdas", c.model.sublayer_lambdas},
          {"model.qkvo_lambdas", c.model.qkvo_lambdas},
          {"model.mudd", c.model.mudd},
          {"model.paired_head_layers", !paired.empty()},
          {"model.xsa_layers", !xsa.empty()},
          {"model.attn_gate_layers", !gates.empty()},
          {"model.yarn", c.model.yarn}})
      if (on) fail(key, "needs model.arch modern");
  }
  if (c.model.key_offset && (!c.model.rotary_truncate || c.model.window <= 0))
    fail("model.key_offset",
         "shifts the keys' unrotated half in the long-window blocks: needs model.rotary_truncate "
         "and model.window");
  if (c.model.bigram_rows != 0 && (c.model.bigram_rows < 2 || c.model.bigram_rows - 1 > INT32_MAX))
    fail("model.bigram_rows",
         "must be 0 (off) or in [2, 2^31] (the hash is an int32 mod rows - "
         "1), got " +
             std::to_string(c.model.bigram_rows));
  if (c.model.smear && (!c.model.x0_norm || c.model.d_model < 12))
    fail("model.smear",
         "smears the embedding rows before x0's norm: needs model.x0_norm and d_model >= 12");
  if (c.model.mudd && (c.model.n_layer != 11 || c.model.n_head != 6 || !c.model.sublayer_lambdas ||
                       *no_attn != std::vector<int>{6} || c.model.value_embeds != 0 ||
                       !ve_layers->empty() || c.model.bigram_rows != 0 || c.model.x0_lambdas ||
                       c.model.unet_skips || c.model.moe_experts > 0))
    fail("model.mudd",
         "wires record #89's 11 blocks of 6 heads: needs model.n_layer 11, n_head 6, "
         "sublayer_lambdas and no_attn_layers 6, and takes no value tables or bigram_rows (their "
         "gates are not wired to it yet), x0_lambdas, unet_skips or moe");
  if (c.model.sublayer_lambdas && c.model.moe_experts > 0)
    fail("model.sublayer_lambdas", "mixes a dense MLP's output alone: cannot take model.moe");
  if (c.model.norm_eps <= 0) fail("model.norm_eps", "must be positive");
  // An epsilon keeps the norm's division finite; at 1 or more it outweighs the mean square of
  // the activations it divides (1e308 was accepted, and the run stopped at step 3).
  if (c.model.norm_eps >= 1) fail("model.norm_eps", "must be below 1 (a small guard, e.g. 1e-6)");
  if (c.model.rotary_base <= 1) fail("model.rotary_base", "must be above 1");
  if (c.model.rotary_truncate && c.model.n_head > 0 && c.model.d_model % c.model.n_head == 0) {
    const int64_t hd = c.model.d_model / c.model.n_head;
    if (hd % 4 != 0 || hd < 8)
      fail("model.rotary_truncate",
           "needs a head size that is a multiple of 4 and at least 8, got " + std::to_string(hd));
  }
  if (c.model.embed_std <= 0) fail("model.embed_std", "must be positive");
  // The record's embeddings start at 1 (nn.Embedding's N(0, 1)); 1e30 was accepted and the first
  // steps overflowed.
  if (c.model.embed_std > 10)
    fail("model.embed_std", "must be at most 10 (0.02 for GPT-2, 1 for the record)");
  if (c.model.window_block < 0) fail("model.window_block", "must be >= 0 (0: token-granular)");
  if (c.model.window_block > 0 &&
      (c.model.window == 0 || c.model.window % c.model.window_block != 0))
    fail("model.window_block",
         "needs model.window, a multiple of it (window " + std::to_string(c.model.window) + ")");
  if (c.model.doc_bos < -1 || c.model.doc_bos >= c.model.vocab_size)
    fail("model.doc_bos", "must be -1 (off) or a token id below model.vocab_size");
  if (c.model.window < 0 || c.model.window > std::numeric_limits<int32_t>::max())
    fail("model.window", "must be >= 0 (0: no window)");
  const auto& pattern = c.model.window_pattern;
  if (!pattern.empty() && c.model.window == 0) fail("model.window_pattern", "needs model.window");
  if (!pattern.empty() && (static_cast<int64_t>(pattern.size()) != c.model.n_layer ||
                           pattern.find_first_not_of("LS") != std::string::npos))
    fail("model.window_pattern",
         "must be one L or S per block (model.n_layer = " + std::to_string(c.model.n_layer) +
             "), got '" + shown(pattern) + "'");
  if (c.model.window_grow && c.model.window == 0) fail("model.window_grow", "needs model.window");
  // The model is built in train.precision (model_config_of), so a model-only reader checks it.
  const auto& precision = c.train.precision;
  if (precision != "fp32" && precision != "tf32" && precision != "bf16")
    fail("train.precision", "must be fp32, tf32 or bf16, got '" + shown(precision) + "'");
  if (use == ConfigUse::ModelOnly) return;
  if (c.train.steps < 1) fail("train.steps", "must be >= 1");
  if (c.train.micro_batch < 1) fail("train.micro_batch", "must be >= 1");
  if (c.train.batch_tokens < 1 || c.train.batch_tokens % c.model.seq_len != 0)
    fail("train.batch_tokens",
         "must be a positive multiple of model.seq_len = " + std::to_string(c.model.seq_len));
  if (c.train.grad_clip < 0) fail("train.grad_clip", "must be >= 0");
  const auto& s = c.train.lr_schedule;
  if (s != "constant" && s != "linear" && s != "cosine")
    fail("train.lr_schedule", "must be constant, linear or cosine, got '" + shown(s) + "'");
  if (c.train.lr_warmup_steps < 0) fail("train.lr_warmup_steps", "must be >= 0");
  if (c.train.lr_cooldown_frac < 0 || c.train.lr_cooldown_frac > 1)
    fail("train.lr_cooldown_frac", "must be in [0, 1]");
  if (c.train.lr_floor < 0 || c.train.lr_floor > 1) fail("train.lr_floor", "must be in [0, 1]");
  if (c.train.eval_every < 0) fail("train.eval_every", "must be >= 0");
  if (c.train.val_tokens < c.model.seq_len)
    fail("train.val_tokens", "must be at least model.seq_len = " + std::to_string(c.model.seq_len));
  if (c.train.warmup_steps < 0) fail("train.warmup_steps", "must be >= 0");
  if (c.train.target_val_loss < 0)
    fail("train.target_val_loss", "must be >= 0 (0 = off; a loss is never negative)");
  if (!(c.train.diverge_loss_factor == 0 || c.train.diverge_loss_factor > 1))
    fail("train.diverge_loss_factor", "must be 0 (off) or above 1");
  if (c.train.diverge_zero_grad_steps < 0) fail("train.diverge_zero_grad_steps", "must be >= 0");
  if (StageSchedule::of(c).enabled()) {
    if (c.data.bos < 0 || c.data.bos >= c.model.vocab_size)
      fail("data.bos", "must be a token id in [0, model.vocab_size) with train.stages");
    if (c.model.window_grow)
      fail("model.window_grow", "cannot be on with train.stages (the stages set the windows)");
  } else if (c.model.yarn && use == ConfigUse::Training) {
    fail("model.yarn", "rescales at each change of the stages' long window: needs train.stages");
  }
  if (c.model.yarn && c.model.window <= 0) fail("model.yarn", "needs model.window");
  if (c.zero.stage < 1 || c.zero.stage > 3) fail("zero.stage", "must be 1, 2 or 3");
  if (c.zero.bucket_mb < 0) fail("zero.bucket_mb", "must be >= 0");
  if (c.zero.progress != "thread" && c.zero.progress != "poll")
    fail("zero.progress", "must be thread or poll, got '" + shown(c.zero.progress) + "'");
  if (c.checkpoint.every < 0) fail("checkpoint.every", "must be >= 0");
  if (c.checkpoint.keep < 1) fail("checkpoint.keep", "must be >= 1");
  // Below a second a healthy collective waits longer than the timeout (a rank's own work between
  // collectives, such as rank 0 committing a checkpoint, takes that long): the watchdog ended
  // healthy runs, reporting "0.0 s".
  if (!(c.comm.timeout_s == 0 || c.comm.timeout_s >= kMinCommTimeoutS))
    fail("comm.timeout_s", "must be 0 (no watchdog) or at least " +
                               format_double(kMinCommTimeoutS) + " s, got " +
                               format_double(c.comm.timeout_s));
  if (c.comm.device_collectives != "nccl" && c.comm.device_collectives != "mpi")
    fail("comm.device_collectives",
         "must be nccl or mpi, got '" + shown(c.comm.device_collectives) + "'");
  if (c.log.every < 1) fail("log.every", "must be >= 1");
  if (c.log.peak_gflops < 0) fail("log.peak_gflops", "must be >= 0 (0 = the GPU table)");
  if (!c.log.trace.empty() && !parse_step_range(c.log.trace))
    fail("log.trace", "must be FIRST-LAST or STEP (optimizer steps from 1, FIRST <= LAST), got '" +
                          shown(c.log.trace) + "'");
}

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> out;
  // Allowed (a short trial of a long run's config), but the lr never reaches its peak.
  if (c.train.lr_warmup_steps > c.train.steps)
    out.push_back("warning: " + config_origin(c, "train.lr_warmup_steps") +
                  ": key 'train.lr_warmup_steps' = " + std::to_string(c.train.lr_warmup_steps) +
                  " is beyond train.steps = " + std::to_string(c.train.steps) +
                  ": the learning rate never reaches its peak (the last step takes " +
                  format_double(static_cast<double>(c.train.steps) /
                                static_cast<double>(c.train.lr_warmup_steps)) +
                  " of it)");
  // Allowed (apps/bench_zero's "trace idle" rows), but nothing is traced.
  if (const auto steps = parse_step_range(c.log.trace); steps && steps->first > c.train.steps)
    out.push_back("warning: " + config_origin(c, "log.trace") + ": key 'log.trace' = " +
                  c.log.trace + " starts after train.steps = " + std::to_string(c.train.steps) +
                  ": the trace will hold no step");
  return out;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ConfigUse use) {
  return parse_root(load_yaml_file(path), path, overrides, use);
}

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides, ConfigUse use) {
  return parse_root(single_document(yaml_text, source), source, overrides, use);
}

namespace {

// Emits the (key parts, value) pairs whose first `depth` parts equal those of items[first] as a
// nested map; pairs sharing a prefix are adjacent because the field table declares them so.
size_t emit_fields(YAML::Emitter& out,
                   const std::vector<std::pair<std::vector<std::string>, std::string>>& items,
                   size_t first, size_t depth) {
  out << YAML::BeginMap;
  size_t i = first;
  auto same_prefix = [&](size_t j) {
    for (size_t d = 0; d < depth; ++d)
      if (items[j].first[d] != items[first].first[d]) return false;
    return true;
  };
  while (i < items.size() && same_prefix(i)) {
    const auto& parts = items[i].first;
    out << YAML::Key << parts[depth];
    if (parts.size() == depth + 1) {
      out << YAML::Value << items[i].second;
      ++i;
    } else {
      out << YAML::Value;
      i = emit_fields(out, items, i, depth + 1);
    }
  }
  out << YAML::EndMap;
  return i;
}

}  // namespace

std::string config_to_yaml(const Config& config) {
  std::vector<std::pair<std::vector<std::string>, std::string>> items;
  for (const auto& f : config_fields())
    items.emplace_back(split_key(f.key), field_value_string(config, f));
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (size_t i = 0; i < items.size();) {
    out << YAML::Key << items[i].first[0] << YAML::Value;
    if (items[i].first.size() == 1)  // a top-level key
      out << items[i++].second;
    else
      i = emit_fields(out, items, i, 1);
  }
  YAML::Node optim(YAML::NodeType::Sequence);
  for (const auto& g : config.optim)
    optim.push_back(YAML::Clone(g.node));
  out << YAML::Key << "optim" << YAML::Value << optim;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_reference_markdown() {
  std::string s = "| key | type | default | description |\n| --- | --- | --- | --- |\n";
  for (const auto& f : config_fields()) {
    std::string def = f.required ? "(required)" : "`" + f.default_value + "`";
    if (!f.required && f.default_value.empty()) def = "`''`";
    std::string doc = f.doc;
    for (size_t p = doc.find('|'); p != std::string::npos; p = doc.find('|', p + 2))
      doc.replace(p, 1, "\\|");
    s += "| `" + f.key + "` | " + f.type + " | " + def + " | " + doc + " |\n";
  }
  s +=
      "| `optim` | list | (required) | parameter groups `{params: [globs], optimizer: name, "
      "<hyperparameters>}`, first match wins; a group naming no parameter is an error unless it "
      "says `optional: true`; or the path of a preset file. `--set optim.<i>.<key>=value` sets one "
      "key of group i, the groups counted from 0 (`optim.0.lr=0.01`: the first group's lr) |\n";
  return s;
}

}  // namespace engine
