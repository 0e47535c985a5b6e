// Commands that change or administer storage: rm, gc, token.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "common/json.h"
#include "common/status.h"
#include "common/token.h"

namespace gradsnap {
namespace cli {

absl::Status RunRm(Context& ctx) {
  const std::string& job = ctx.args.positional[0];
  RETURN_IF_ERROR(CheckJob(job));
  ASSIGN_OR_RETURN(int64_t step, ParseInt(ctx.args.positional[1], 0, INT64_MAX, "step"));
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  RETURN_IF_ERROR(c->Delete(job, step));
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(job), ",\"step\":", step, ",\"deleted\":true}\n"));
  } else {
    Print(absl::StrCat("deleted job ", job, " step ", step, "\n"));
  }
  return absl::OkStatus();
}

absl::Status RunGc(Context& ctx) {
  const std::string& job = ctx.args.positional[0];
  RETURN_IF_ERROR(CheckJob(job));
  if (!ctx.args.Has("keep-last")) return absl::InvalidArgumentError("gc needs --keep-last N");
  client::GcPolicy policy;
  ASSIGN_OR_RETURN(int64_t keep_last, ParseInt(ctx.args.Get("keep-last"), 1, 1 << 30,
                                               "--keep-last"));
  ASSIGN_OR_RETURN(int64_t keep_every, ParseInt(ctx.args.Get("keep-every", "0"), 0, INT32_MAX,
                                                "--keep-every"));
  policy.keep_last = static_cast<int>(keep_last);
  policy.keep_every = static_cast<int>(keep_every);
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  // A job name with no checkpoint at all (a typo) is exit 4, as for every other command.
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> any, c->List(job, /*include_pending=*/true));
  if (any.empty()) return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoints"));
  ASSIGN_OR_RETURN(client::GcResult r, c->Gc(job, policy));
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(job), ",\"deleted_steps\":[",
                       absl::StrJoin(r.deleted_steps, ","),
                       "],\"bytes_reclaimed\":", r.bytes_reclaimed, "}\n"));
  } else if (r.deleted_steps.empty()) {
    Print(absl::StrCat("job ", job, ": nothing to delete\n"));
  } else {
    Print(absl::StrCat("job ", job, ": deleted ", r.deleted_steps.size(), " checkpoint(s) (steps ",
                       absl::StrJoin(r.deleted_steps, ","), "), reclaimed ",
                       HumanBytes(r.bytes_reclaimed), "\n"));
  }
  return absl::OkStatus();
}

absl::Status RunToken(Context& ctx) {
  const std::string& job = ctx.args.positional[0];
  RETURN_IF_ERROR(CheckJob(job));
  if (!ctx.args.Has("secret-file")) {
    return absl::InvalidArgumentError("token needs --secret-file F");
  }
  ASSIGN_OR_RETURN(std::string secret, ReadSecretFile(ctx.args.Get("secret-file")));
  ASSIGN_OR_RETURN(std::string token, MintJobToken(secret, job));
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(job), ",\"token\":", JsonQuote(token), "}\n"));
  } else {
    Print(token + "\n");
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace gradsnap
