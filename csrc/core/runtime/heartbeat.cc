#include "heartbeat.h"

#include <algorithm>

#include "../base/tag.h"

namespace ddl {
namespace {

// Under the agreements' group id (no group holds it), sequence 0, a step of their own.
constexpr uint64_t kBeatTag =
    tag::make(tag::kAgreementGroup, 0, tag::slot(tag::kControlPhase, tag::kHeartbeatStep), 0);

}  // namespace

uint64_t Heartbeat::idOf(const std::string& address) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : address) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void Heartbeat::beat(const std::string& address, PeerId peer) {
  auto [it, added] = targets_.emplace(address, Target{peer, 0});
  ++it->second.uses;
}

void Heartbeat::unbeat(const std::string& address) {
  auto it = targets_.find(address);
  if (it != targets_.end() && --it->second.uses <= 0) targets_.erase(it);
}

void Heartbeat::watch(const std::string& address, TimePoint now) {
  const uint64_t id = idOf(address);
  auto it = std::lower_bound(watched_.begin(), watched_.end(), id,
                             [](const Watched& w, uint64_t id) { return w.id < id; });
  if (it == watched_.end() || it->id != id) {
    it = watched_.insert(it, Watched{id, address, now, 0, false, away_});
  }
  ++it->uses;
  if (!it->reported) nextSilence_ = std::min(nextSilence_, now + timeout_ - silence(*it, now));
  // Listening from `now`: a tick more than a period later comes after an absence. (A tick that
  // found nothing to watch left due_ at never, and an absence right after the first watch, a
  // turning thread waiting for the store, was counted as the peers' silence.)
  due_ = std::min(due_, now);
}

void Heartbeat::unwatch(const std::string& address) {
  auto it = findWatched(idOf(address));
  if (it != watched_.end() && --it->uses <= 0) watched_.erase(it);
}

void Heartbeat::receive(Transport& transport, TimePoint now) {
  while (true) {
    if (receiving_) {
      if (!receiving_->done) return;  // still arriving
      if (!receiving_->failed() && receiving_->receivedBytes == sizeof(inbox_)) {
        auto it = findWatched(inbox_);
        if (it != watched_.end() && now >= it->heard) {
          it->heard = now;
          it->awayAtHeard = away_;
        }
      }
      receiving_.reset();
    }
    // A request kept from a look that found nothing: most ticks find no beat.
    if (spare_) {
      *spare_ = Request{};
    } else {
      spare_ = std::make_unique<Request>();
    }
    if (!transport.receiveArrived(kBeatTag, tag::kGroupAndSlot, &inbox_, sizeof(inbox_),
                                  spare_.get())) {
      return;
    }
    receiving_ = std::move(spare_);
  }
}

std::vector<std::pair<std::string, std::string>> Heartbeat::tick(Transport& transport,
                                                                 TimePoint now,
                                                                 const IsLost& lost) {
  std::vector<std::pair<std::string, std::string>> silent;
  if (!on()) return silent;
  // Away for more than a period past the tick's due time: the beats of that stretch wait in the
  // transport, and the stretch is no peer's silence.
  if (now > due_ && now - due_ > period_) away_ += now - due_;
  receive(transport, now);
  sendDue(transport, now, lost);
  nextSilence_ = TimePoint::max();
  for (Watched& w : watched_) {
    if (w.reported) continue;
    const std::chrono::nanoseconds silentFor = silence(w, now);
    if (silentFor < timeout_) {
      nextSilence_ = std::min(nextSilence_, now + timeout_ - silentFor);
      continue;
    }
    w.reported = true;
    if (lost(w.address)) continue;
    silent.emplace_back(
        w.address,
        "it sent no heartbeat for " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(silentFor).count()) +
            " ms (the process or its host stopped, or the link to it is cut)");
  }
  due_ = next();
  return silent;
}

void Heartbeat::sendDue(Transport& transport, TimePoint now, const IsLost& lost) {
  if (!on()) return;
  std::erase_if(sent_, [](const auto& s) { return s->request.done; });
  if (now < nextBeat_) return;
  nextBeat_ = now + period_;
  for (const auto& [address, target] : targets_) {
    if (lost(address)) continue;
    auto& s = sent_.emplace_back(std::make_unique<Sent>());
    s->id = self_;
    transport.send(target.peer, kBeatTag, &s->id, sizeof(s->id), &s->request);
  }
}

TimePoint Heartbeat::next() const {
  if (!on()) return TimePoint::max();
  // A peer heard since is looked at then, and found alive: no harm in the early look.
  return std::min(targets_.empty() ? TimePoint::max() : nextBeat_, nextSilence_);
}

void Heartbeat::stop(Transport& transport) {
  if (receiving_ && !receiving_->done) transport.cancel(receiving_.get());
  for (auto& s : sent_) {
    if (!s->request.done) transport.cancel(&s->request);
  }
}

std::optional<TimePoint> Heartbeat::heard(const std::string& address) const {
  auto it = findWatched(idOf(address));
  if (it == watched_.end()) return std::nullopt;
  return it->heard;
}

}  // namespace ddl
