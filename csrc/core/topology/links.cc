#include "links.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "../base/types.h"

namespace ddl {
namespace {

double parseNumber(const std::string& text, const std::string& entry, size_t& used,
                   bool zeroAllowed) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  used = static_cast<size_t>(end - text.c_str());
  if (used == 0 || !(v > 0 || (zeroAllowed && v == 0)) || !std::isfinite(v)) {
    throw Error("ddl: TORCH_DDL_LINKS entry '" + entry +
                "' is not 'dimension:latency:bandwidth[:overhead]' (e.g. '1:50us:117MB')");
  }
  return v;
}

// "117MB", "1.2GB", "5e9": bytes per second.
double parseBandwidth(const std::string& bw, const std::string& entry) {
  size_t used = 0;
  double bandwidth = parseNumber(bw, entry, used, false);
  std::string unit = bw.substr(used);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == '/') unit.pop_back();
  if (unit == "K") {
    bandwidth *= 1e3;
  } else if (unit == "M") {
    bandwidth *= 1e6;
  } else if (unit == "G") {
    bandwidth *= 1e9;
  } else if (!unit.empty()) {
    throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "': bandwidth unit '" + unit +
                "' is not B, KB, MB or GB");
  }
  return bandwidth;
}

// "50us", "2ms", "0.5": seconds (a bare number is microseconds).
double parseTime(const std::string& text, const std::string& entry) {
  size_t used = 0;
  double value = parseNumber(text, entry, used, true);
  const std::string unit = text.substr(used);
  if (unit == "s") {
  } else if (unit == "ms") {
    value *= 1e-3;
  } else if (unit == "us" || unit.empty()) {
    value *= 1e-6;
  } else if (unit == "ns") {
    value *= 1e-9;
  } else {
    throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "': time unit '" + unit +
                "' is not s, ms, us or ns");
  }
  return value;
}

}  // namespace

const LinkCost& LinkCosts::at(int dimension) const {
  static const LinkCosts defaults = defaultLinks();
  if (dimension < static_cast<int>(byDimension.size())) return byDimension[dimension];
  if (!byDimension.empty()) return byDimension.back();
  return defaults.at(dimension);
}

std::string LinkCosts::describe() const {
  std::ostringstream out;
  for (size_t k = 0; k < byDimension.size(); ++k) {
    if (k > 0) out << ",";
    out << k << ":" << byDimension[k].latency * 1e6 << "us:" << byDimension[k].bandwidth / 1e6
        << "MB:" << byDimension[k].overhead * 1e6 << "us";
  }
  if (reduceBandwidth > 0) out << ",reduce:" << reduceBandwidth / 1e6 << "MB";
  std::string origins;
  for (size_t k = 0; k < byDimension.size(); ++k) {
    if (byDimension[k].origin == "default") continue;
    origins += (origins.empty() ? "" : ", ") + std::to_string(k) + " " + byDimension[k].origin;
  }
  if (!origins.empty()) out << " (" << origins << ")";
  return out.str();
}

LinkCosts defaultLinks() {
  return LinkCosts{{{2e-6, 5e9, 0.1e-6}, {30e-6, 1.25e9, 3e-6}, {50e-6, 1.25e9, 3e-6}}};
}

LinkCosts parseLinks(const std::string& spec) {
  LinkCosts links = defaultLinks();
  std::string all = spec;
  std::replace(all.begin(), all.end(), ';', ',');
  std::istringstream entries(all);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry.erase(std::remove_if(entry.begin(), entry.end(), ::isspace), entry.end());
    if (entry.empty()) continue;
    size_t a = entry.find(':');
    if (entry.substr(0, a) == "reduce" && a != std::string::npos) {
      links.reduceBandwidth = parseBandwidth(entry.substr(a + 1), entry);
      continue;
    }
    size_t b = a == std::string::npos ? a : entry.find(':', a + 1);
    if (b == std::string::npos) {
      throw Error("ddl: TORCH_DDL_LINKS entry '" + entry +
                  "' is not 'dimension:latency:bandwidth' (e.g. '1:50us:117MB')");
    }
    std::string dim = entry.substr(0, a);
    if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos || dim.size() > 2) {
      throw Error("ddl: TORCH_DDL_LINKS entry '" + entry + "' does not start with a dimension");
    }
    int k = std::stoi(dim);
    std::string lat = entry.substr(a + 1, b - a - 1);
    std::string bw = entry.substr(b + 1);
    const size_t c = bw.find(':');
    std::string overheadText;
    if (c != std::string::npos) {
      overheadText = bw.substr(c + 1);
      bw.resize(c);
    }
    const double latency = parseTime(lat, entry);
    const double bandwidth = parseBandwidth(bw, entry);
    if (static_cast<int>(links.byDimension.size()) <= k) {
      links.byDimension.resize(k + 1, links.byDimension.back());
    }
    const double overhead =
        overheadText.empty() ? links.byDimension[k].overhead : parseTime(overheadText, entry);
    links.byDimension[k] = LinkCost{latency, bandwidth, overhead, "TORCH_DDL_LINKS"};
  }
  return links;
}

}  // namespace ddl
