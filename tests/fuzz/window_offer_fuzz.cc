// A window's offer (group/window.h), from every rank as it registers.
#include "../../csrc/core/group/window.h"
#include "fuzz.h"

DDL_FUZZ_TARGET(window_offer) {
  using namespace ddl;
  WindowOffer offer;
  if (!decodeWindowOffer(reinterpret_cast<const char*>(data), size, &offer)) return 0;
  const std::string bytes = encodeWindowOffer(offer);
  DDL_FUZZ_CHECK(bytes.size() == size);
  WindowOffer again;
  DDL_FUZZ_CHECK(decodeWindowOffer(bytes.data(), bytes.size(), &again) &&
                 again.layout == offer.layout && again.share == offer.share &&
                 again.region == offer.region);
  return 0;
}
