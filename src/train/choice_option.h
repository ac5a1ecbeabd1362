#pragma once
// A Boost.Program_options value for a setting that takes one of the words of an enum
// (src/base/choices.h): shown with its current word as the default, parsed into *field when the
// options are notified, a gpt2::UserError "<what> = WORD: must be one of a | b" otherwise. The
// config (`what` = "config: section.key") and the tools' command lines (`what` = "--name") use it.
#include <boost/program_options.hpp>

#include <string>

#include "src/base/choices.h"

namespace gpt2 {

template <typename E>
boost::program_options::typed_value<std::string>* choice_option(const std::string& what, E* field) {
  return boost::program_options::value<std::string>()
      ->default_value(choice_name(*field))
      ->notifier([what, field](const std::string& word) { *field = parse_choice<E>(what, word); });
}

}  // namespace gpt2
