// The links of the simulated network (SimLink, network.h): each books the earliest free stretch.
#include <algorithm>

#include "network.h"

namespace ddl {

int64_t SimLink::book(int64_t now, int64_t at, int64_t length) {
  if (at >= tail_.first) {  // no span starts after `at`: it joins the last one or goes after it
    const int64_t t = std::max(at, tail_.second);
    if (length <= 0) return t;
    booked_ += length;
    if (tail_.second > 0 && t == tail_.second) {  // a busy link's next packet, most often
      tail_.second = t + length;
      return t;
    }
    if (tail_.second > now) {
      insert(end(), tail_, now);
    } else {
      chunks_.clear();  // the last span ended by now, so did every one before it
    }
    tail_ = {t, t + length};
    return t;
  }
  // Among the spans: the tail joins the last chunk while they are searched (past its size for
  // a moment: a chunk made for it here would be freed again below).
  if (chunks_.empty()) chunks_.emplace_back();
  chunks_.back().push_back(tail_);
  Place next = firstAfter(at);
  const Place first{0, 0};
  int64_t t = at;
  if (!(next == first)) t = std::max(t, span(previous(next)).second);
  while (!(next == end()) && span(next).first < t + length) {
    t = std::max(t, span(next).second);
    next = after(next);
  }
  if (length > 0) {
    booked_ += length;
    const int64_t finish = t + length;
    const bool joinsBefore = !(next == first) && span(previous(next)).second == t;
    const bool joinsAfter = !(next == end()) && span(next).first == finish;
    if (joinsBefore && joinsAfter) {
      span(previous(next)).second = span(next).second;
      erase(next);
    } else if (joinsBefore) {
      span(previous(next)).second = finish;
    } else if (joinsAfter) {
      span(next).first = t;
    } else {
      insert(next, {t, finish}, now);
    }
  }
  tail_ = chunks_.back().back();
  erase(Place{chunks_.size() - 1, chunks_.back().size() - 1});
  return t;
}

SimLink::Place SimLink::firstAfter(int64_t at) {
  // Bookings land near the end (the next packets of the flows on the link): look back from it
  // a few spans, then search.
  Place p = end();
  for (int k = 0; k < 16; ++k) {
    if (p == Place{0, 0}) return p;
    const Place before = previous(p);
    if (span(before).first <= at) return p;
    p = before;
  }
  auto chunk =
      std::upper_bound(chunks_.begin(), chunks_.end(), at,
                       [](int64_t value, const auto& c) { return value < c.back().first; });
  if (chunk == chunks_.end()) return end();
  auto in = std::upper_bound(chunk->begin(), chunk->end(), at,
                             [](int64_t value, const Span& b) { return value < b.first; });
  return Place{static_cast<size_t>(chunk - chunks_.begin()),
               static_cast<size_t>(in - chunk->begin())};
}

void SimLink::forget(int64_t now) {
  // Ends rise with starts: the spans are disjoint and in order.
  while (!chunks_.empty() && chunks_.front().back().second <= now) chunks_.erase(chunks_.begin());
  if (chunks_.empty()) return;
  std::vector<Span>& front = chunks_.front();
  auto ended =
      std::find_if(front.begin(), front.end(), [&](const Span& b) { return b.second > now; });
  front.erase(front.begin(), ended);
}

void SimLink::insert(Place p, Span span, int64_t now) {
  if (p == end()) {
    if (chunks_.empty() || chunks_.back().size() >= kChunk) {
      forget(now);  // a chunk more: first let go of what has ended
      chunks_.emplace_back();
    }
    chunks_.back().push_back(span);
    return;
  }
  std::vector<Span>& chunk = chunks_[p.c];
  chunk.insert(chunk.begin() + static_cast<std::ptrdiff_t>(p.i), span);
  if (chunk.size() > 2 * kChunk) {
    std::vector<Span> upper(chunk.begin() + kChunk, chunk.end());
    chunk.resize(kChunk);
    chunks_.insert(chunks_.begin() + static_cast<std::ptrdiff_t>(p.c) + 1, std::move(upper));
  }
}

void SimLink::erase(Place p) {
  std::vector<Span>& chunk = chunks_[p.c];
  chunk.erase(chunk.begin() + static_cast<std::ptrdiff_t>(p.i));
  if (chunk.empty()) chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(p.c));
}

}  // namespace ddl
