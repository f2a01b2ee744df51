// Sleeping on 32-bit words until another thread or process changes them (Linux futexes).
// A waiter reads a word, looks for work, and sleeps while the word still holds what it read;
// whoever makes work bumps the word and wakes it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

namespace xfer::futex {

// shared: the word is in memory other processes map (a waiter may be in another process).
void Wake(std::atomic<uint32_t>* word, bool shared);

struct Watch {
  std::atomic<uint32_t>* word = nullptr;
  uint32_t seen = 0;  // the value the waiter read
  bool shared = false;
};

// Sleeps until one of the words no longer holds what was seen, a wake-up, or `until`
// (spurious wake-ups are possible: the caller looks again). One word: a plain futex wait.
// Up to 128 words are watched at once (futex_waitv); past that, or where futex_waitv is
// missing (before Linux 5.16) or refused (a seccomp filter), the sleep is cut into slices of
// 1 ms on the first word and the others are checked between them.
void WaitAny(std::span<const Watch> words, std::chrono::steady_clock::time_point until);

}  // namespace xfer::futex
