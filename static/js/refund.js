/* A refund's confirmation (dashboard/refund.html): its button sends the form once. While Stripe
 * takes its time, a second click would post the same confirmation again; the server refunds
 * once anyway (the second is refused: "changed since it was shown"), but the browser would then
 * show that refusal instead of the refund that was made.
 */
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    if (!event.target.matches("form[data-submit-once]")) return;
    event.target.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = true; });
  });
})();
