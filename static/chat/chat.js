// The few things the server cannot do for the chat page. Everything else is server-rendered HTML
// that htmx swaps in: over the page's WebSocket (htmx's ws extension on /ws/chat/<id>/page/, see
// chatapp/ui/page_feed.py and docs/protocol.md) or by HTTP. This file:
//   - composer: Enter sends (not the Enter that confirms an IME composition), Shift+Enter adds a
//     line; the token count under it is the server's (htmx posts the text, debounced); Send is
//     disabled while the text is blank, over the character limit or the count says the message would
//     be refused; a sent message shows as a "pending" bubble in #outbox until the server's rendered
//     copy arrives in #messages;
//   - after every (re)connect, pending bubbles are sent again (the server ignores duplicates);
//     they are kept in sessionStorage until then, so a reload loses none: one the server refused
//     ("Not sent", the cap of waiting messages) stays with Retry and Dismiss buttons;
//   - Retry on a failed reply sends its turn's question again, as a new message; Continue on a reply
//     cut off at the token limit asks the model to go on; Regenerate on the last reply sends
//     chat.regenerate (earlier versions are fetched by htmx, "Back to the current version" empties them);
//   - reflects the socket state in data-ws on #chat-page (browser tests wait on it); a chat
//     deleted elsewhere (close code 4404) disables the composer;
//   - keeps focus, open <details>, text typed into the inspector's forms (a key fact's new value)
//     and the scroll position across swaps;
//   - a search match's link (#message-<id>) scrolls its message into view, marks and focuses it,
//     again once the socket's snapshot has replaced the transcript;
//   - drawers (chat list, inspector) on narrow screens, closing the export menu on a click outside
//     it or Escape, "Copy" buttons (messages, code blocks, the inspector's texts), the theme
//     toggle (stored in localStorage; base.html applies it before the first paint), and
//     dismissing the offline banner on a phone.
// Text is only ever inserted with textContent.
(function () {
  "use strict";

  let socket = null; // the ws extension's socket wrapper while the socket is open

  function page() { return document.getElementById("chat-page"); }

  function newClientId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2);
  }

  function sendPending(bubble) {
    if (!socket || bubble.querySelector(".rejected")) return;
    socket.send(JSON.stringify({
      type: "chat.send",
      client_message_id: bubble.dataset.clientId,
      text: bubble.querySelector(".content").textContent,
    }));
  }

  // --- the outbox, kept in sessionStorage per chat ------------------------------------------
  // [{id, text, rejected}]: what #outbox shows, written after every change of it.
  function outboxKey() { return "kestrel.outbox." + page().dataset.sessionId; }

  function outboxSave() {
    const kept = Array.from(document.querySelectorAll("#outbox [data-client-id]"), (bubble) => {
      const rejected = bubble.querySelector(".rejected");
      return { id: bubble.dataset.clientId, text: bubble.querySelector(".content").textContent,
        rejected: rejected ? rejected.textContent : "" };
    });
    try {
      if (kept.length) sessionStorage.setItem(outboxKey(), JSON.stringify(kept));
      else sessionStorage.removeItem(outboxKey());
    } catch (error) { /* storage blocked or full: this page only */ }
  }

  function bubbleCreate(id, text) {
    const bubble = document.createElement("article");
    bubble.className = "message user pending";
    bubble.dataset.clientId = id;
    const content = document.createElement("div");
    content.className = "content plain";
    content.textContent = text;
    const note = document.createElement("p");
    note.className = "pending-note";
    note.textContent = socket ? "sending…" : "waiting for the connection…";
    bubble.append(content, note);
    document.getElementById("outbox").append(bubble);
    return bubble;
  }

  // A refused message (the server's "Not sent" line, or one restored from storage) gets its buttons.
  function rejectedActions(bubble) {
    if (bubble.querySelector(".retry-actions")) return;
    const actions = document.createElement("p");
    actions.className = "retry-actions";
    for (const [label, action] of [["Retry", "retry"], ["Dismiss", "dismiss"]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "small";
      button.dataset.pendingAction = action;
      button.textContent = label;
      actions.append(button);
    }
    bubble.append(actions);
  }

  function outboxRestore() {
    let kept = [];
    try { kept = JSON.parse(sessionStorage.getItem(outboxKey()) || "[]"); } catch (error) { kept = []; }
    kept.forEach(({ id, text, rejected }) => {
      if (document.querySelector('#outbox [data-client-id="' + CSS.escape(id) + '"]')) return;
      const bubble = bubbleCreate(id, text);
      if (rejected) {
        const status = document.createElement("p");
        status.className = "status rejected";
        status.textContent = rejected;
        bubble.append(status);
        rejectedActions(bubble);
      }
    });
  }

  // A pending bubble is done once the server's copy of the message is in the transcript.
  function reconcileOutbox() {
    const messages = document.getElementById("messages");
    document.querySelectorAll("#outbox [data-client-id]").forEach((bubble) => {
      const selector = '[data-client-id="' + CSS.escape(bubble.dataset.clientId) + '"]';
      if (messages && messages.querySelector(selector)) bubble.remove();
      else if (bubble.querySelector(".rejected")) rejectedActions(bubble);
    });
    if (page()) outboxSave();
  }

  function composerDisable() {
    const form = document.getElementById("composer");
    if (form) form.querySelectorAll("textarea, button").forEach((element) => { element.disabled = true; });
  }

  function setConnection(state, label) {
    const element = page();
    if (element) element.dataset.ws = state;
    const status = document.getElementById("connection");
    if (status) status.textContent = label;
  }

  document.addEventListener("htmx:wsConnecting", () => setConnection("connecting", "connecting…"));
  document.addEventListener("htmx:wsOpen", (event) => {
    socket = event.detail.socketWrapper;
    setConnection("open", "connected");
    document.querySelectorAll("#outbox [data-client-id]").forEach(sendPending);
  });
  document.addEventListener("htmx:wsClose", (event) => {
    socket = null;
    if (event.detail.event.code === 4404) {
      setConnection("gone", "this chat no longer exists");
      composerDisable();
    } else setConnection("closed", "reconnecting…");
  });

  // --- keeping the reader's place across swaps ------------------------------------------------
  let kept = null;

  function keepPlace() {
    const thread = document.getElementById("thread");
    kept = {
      open: Array.from(document.querySelectorAll("details[open][id]"), (d) => d.id),
      typed: Array.from(document.querySelectorAll("#inspector input[type=text][id]"))
        .filter((input) => input.value !== input.defaultValue)
        .map((input) => [input.id, input.defaultValue, input.value]),
      focus: document.activeElement && document.activeElement.id,
      atBottom: thread ? thread.scrollHeight - thread.scrollTop - thread.clientHeight < 80 : false,
    };
  }

  function restorePlace() {
    if (!kept) return;
    kept.open.forEach((id) => {
      const details = document.getElementById(id);
      if (details && details.tagName === "DETAILS") details.open = true;
    });
    // Only into the same field showing the same stored value: a socket push re-renders the
    // inspector, but the answer to the user's own form (a new default) wins.
    kept.typed.forEach(([id, before, value]) => {
      const input = document.getElementById(id);
      if (input && input.defaultValue === before && input.value === before) input.value = value;
    });
    if (kept.focus && (!document.activeElement || document.activeElement === document.body)) {
      const again = document.getElementById(kept.focus);
      if (again) again.focus({ preventScroll: true });
    }
    const thread = document.getElementById("thread");
    if (thread && kept.atBottom) thread.scrollTop = thread.scrollHeight;
    kept = null;
  }

  document.addEventListener("htmx:wsBeforeMessage", keepPlace);
  document.addEventListener("htmx:wsAfterMessage", () => { restorePlace(); reconcileOutbox(); });
  document.addEventListener("htmx:beforeSwap", keepPlace);
  document.addEventListener("htmx:afterSettle", (event) => {
    restorePlace();
    // The user's own action (an HTTP swap, never a socket push) replaced what had focus: move
    // focus into what replaced it rather than leaving it on <body>.
    const swapped = event.detail.elt;
    if (document.activeElement === document.body && swapped && swapped.isConnected) {
      const next = swapped.querySelector("[autofocus]") ||
        swapped.querySelector("a[href], button:not([disabled]), input:not([type=hidden]), textarea, select");
      if (next) next.focus();
    }
  });

  // "Compress now" answers with this event (chatapp/views.py): its text goes in the status region.
  document.body.addEventListener("chat:announce", (event) => {
    const region = document.getElementById("announce");
    if (region) region.textContent = event.detail.text;
  });

  // The tab's title follows the chat's title (renamed, or set by the first message).
  function titleSync() {
    const heading = document.getElementById("chat-title");
    if (heading) {
      const title = heading.textContent.trim() + " · Kestrel Assistant";
      if (document.title !== title) document.title = title;
    }
  }
  document.addEventListener("htmx:wsAfterMessage", titleSync);
  document.addEventListener("htmx:afterSettle", titleSync);

  // --- the message a search match links to -----------------------------------------------------
  let jumpPending = false; // scroll to it again after the socket's first snapshot

  function jumpToMessage(scroll) {
    const id = location.hash.slice(1);
    const message = /^message-\d+$/.test(id) && document.getElementById(id);
    if (!message) return;
    document.querySelectorAll(".message.jump-target").forEach((m) => m.classList.remove("jump-target"));
    message.classList.add("jump-target");
    message.tabIndex = -1;
    if (!scroll) return;
    message.scrollIntoView({ block: "center" });
    message.focus({ preventScroll: true });
  }
  window.addEventListener("hashchange", () => jumpToMessage(true));
  document.addEventListener("htmx:wsAfterMessage", () => { jumpToMessage(jumpPending); jumpPending = false; });

  document.addEventListener("DOMContentLoaded", () => {
    if (page()) outboxRestore();
    const thread = document.getElementById("thread");
    if (thread) thread.scrollTop = thread.scrollHeight;
    if (page()) { jumpToMessage(true); jumpPending = true; }
    const choice = document.querySelector("[data-theme-choice]");
    if (choice) choice.value = document.documentElement.dataset.theme || "system";
  });

  // --- composer -----------------------------------------------------------------------------
  // A text over the character limit (data-max-chars, the socket's own check) would be refused,
  // and so would one the server's count (#composer-count, data-state "over_window") finds larger
  // than the room the context window leaves: Send is disabled while either holds, and the count
  // under the composer says why.
  function refused(form) {
    const count = document.getElementById("composer-count");
    // Characters as the server counts them: code points, so an emoji is one, not two UTF-16 units.
    return [...form.querySelector("textarea").value].length > Number(form.dataset.maxChars) ||
      Boolean(count && count.dataset.state === "over_window");
  }

  function sendUpdate() {
    const form = document.getElementById("composer");
    const send = form && form.querySelector("#send");
    // A blank message is never sent: Send says so by being disabled, as for one that would be refused.
    if (send && !form.hasAttribute("data-gone")) send.disabled = refused(form) || !form.querySelector("textarea").value.trim();
  }
  document.addEventListener("input", (event) => { if (event.target.id === "composer-text") sendUpdate(); });
  document.addEventListener("htmx:afterSettle", sendUpdate);

  const CONTINUE_TEXT = "Please continue from where your reply was cut off.";

  function send(text) {
    const bubble = bubbleCreate(newClientId(), text);
    document.getElementById("errors").replaceChildren();
    outboxSave();
    sendPending(bubble);
    const thread = document.getElementById("thread");
    thread.scrollTop = thread.scrollHeight;
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.id !== "composer") return;
    event.preventDefault();
    const input = form.querySelector("textarea");
    const text = input.value;
    if (!text.trim() || refused(form) || form.hasAttribute("data-gone")) return;
    input.value = "";
    // The composer's token count (server-rendered, it recounts on "input") goes back to the room left.
    input.dispatchEvent(new Event("input", { bubbles: true }));
    send(text);
  });

  // An Enter that confirms an IME composition (CJK input) must not send (docs/memory.md F-42):
  // browsers flag it with isComposing, but Safari sends the confirming keydown with isComposing
  // false and keyCode 229 ("IME is processing this key").
  function confirmsComposition(event) {
    return event.isComposing || event.keyCode === 229;
  }

  document.addEventListener("keydown", (event) => {
    const input = event.target;
    if (input.id === "composer-text" && event.key === "Enter" && !event.shiftKey && !confirmsComposition(event)) {
      event.preventDefault();
      input.form.requestSubmit();
    }
    if (event.key !== "Escape") return;
    // Escape closes the innermost thing open: the export menu, then a drawer.
    const menu = document.querySelector("details.export-menu[open]");
    if (menu) {
      menu.open = false;
      menu.querySelector("summary").focus();
    } else if (document.body.dataset.drawer) closeDrawer();
  });

  // --- the offline banner on a phone -------------------------------------------------------
  // Its × (shown at phone widths only, chat.css) hides it for good: remembered in localStorage,
  // which an inline script in base.html reads before the banner is painted.
  const BANNER_DISMISSED = "kestrel.offlineBannerDismissed";

  function dismissBanner() {
    document.body.dataset.bannerDismissed = "";
    try { localStorage.setItem(BANNER_DISMISSED, "1"); } catch (error) { /* storage blocked: this page only */ }
    const main = document.getElementById("main");
    if (main) main.focus({ preventScroll: true });
  }

  // --- drawers and copy buttons ------------------------------------------------------------
  // The buttons that open a drawer carry data-drawer-toggle="<drawer id>"; the open drawer's
  // name is data-drawer on <body> (the CSS shows that drawer and dims the page around it).
  // Distinct attributes: a click anywhere inside the page must not count as a toggle click.
  function closeDrawer() {
    const name = document.body.dataset.drawer;
    delete document.body.dataset.drawer;
    document.querySelectorAll("[data-drawer-toggle]").forEach((b) => b.setAttribute("aria-expanded", "false"));
    const toggle = name && document.querySelector('[data-drawer-toggle="' + CSS.escape(name) + '"]');
    if (toggle) toggle.focus();
  }

  document.addEventListener("click", (event) => {
    // The export menu closes on a click anywhere outside it.
    document.querySelectorAll("details.export-menu[open]").forEach((menu) => {
      if (!menu.contains(event.target)) menu.open = false;
    });
    const toggle = event.target.closest("[data-drawer-toggle]");
    if (toggle) {
      const name = toggle.dataset.drawerToggle;
      if (document.body.dataset.drawer === name) {
        closeDrawer();
        return;
      }
      document.body.dataset.drawer = name;
      document.querySelectorAll("[data-drawer-toggle]").forEach((b) => b.setAttribute("aria-expanded", String(b === toggle)));
      const drawer = document.getElementById(name);
      const close = drawer && drawer.querySelector("[data-drawer-close]");
      if (close) close.focus();
      return;
    }
    // A click on the dimmed page around an open drawer lands on <body> (its ::after backdrop).
    if (event.target.closest("[data-drawer-close]") || (event.target === document.body && document.body.dataset.drawer)) {
      closeDrawer();
      return;
    }
    if (event.target.closest("[data-banner-dismiss]")) {
      dismissBanner();
      return;
    }
    const copy = event.target.closest("[data-copy], .copy-code");
    if (copy) {
      copyText(copy, copiedText(copy));
      return;
    }
    // A refused message: Retry sends it again with the same client id (nothing was stored); Dismiss drops it.
    const pending = event.target.closest("[data-pending-action]");
    if (pending) {
      const bubble = pending.closest("[data-client-id]");
      if (pending.dataset.pendingAction === "retry") {
        bubble.querySelectorAll(".rejected, .retry-actions").forEach((element) => element.remove());
        bubble.querySelector(".pending-note").textContent = socket ? "sending…" : "waiting for the connection…";
        sendPending(bubble);
      } else bubble.remove();
      outboxSave();
      document.getElementById("composer-text").focus();
      return;
    }
    // Regenerate the last reply: the server keeps the current one as an earlier version and runs the turn again.
    const regenerate = event.target.closest("[data-regenerate]");
    if (regenerate) {
      if (socket) socket.send(JSON.stringify({ type: "chat.regenerate", turn_id: Number(regenerate.dataset.regenerate) }));
      return;
    }
    const versionsClose = event.target.closest("[data-versions-close]");
    if (versionsClose) {
      const view = document.getElementById(versionsClose.dataset.versionsClose);
      if (view) view.replaceChildren();
      return;
    }
    // A reply cut off at the token limit: ask the model to go on (it sees the reply marked as cut off).
    if (event.target.closest("[data-continue]")) {
      send(CONTINUE_TEXT);
      return;
    }
    // A failed reply: its turn's question again, as a new message (the failed turn stays as it was).
    const retry = event.target.closest("[data-retry-of]");
    if (retry) {
      const source = document.getElementById("message-source-" + retry.dataset.retryOf);
      if (source) send(source.content.textContent);
    }
  });

  // --- copy buttons --------------------------------------------------------------------------
  // data-copy names the element whose text is copied (a <template> holds a message's Markdown);
  // a code block's button copies its code.
  function copiedText(button) {
    if (button.classList.contains("copy-code")) return button.closest(".code-block").querySelector("code").textContent;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return "";
    return source.tagName === "TEMPLATE" ? source.content.textContent : source.textContent;
  }

  // The Clipboard API where the page may use it (a secure context), else a selected <textarea>
  // and execCommand("copy"). The button says "Copied" for two seconds, or "Copy failed".
  function copyText(button, text) {
    const done = (ok) => {
      button.textContent = ok ? "Copied" : "Copy failed";
      button.dataset.copied = ok ? "true" : "false";
      clearTimeout(button.copyTimer);
      button.copyTimer = setTimeout(() => { button.textContent = "Copy"; delete button.dataset.copied; }, 2000);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => done(true), () => done(copyFallback(text)));
    } else done(copyFallback(text));
  }

  function copyFallback(text) {
    const focused = document.activeElement;
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (error) { ok = false; }
    area.remove();
    if (focused) focused.focus({ preventScroll: true });
    return ok;
  }

  // --- the theme toggle ----------------------------------------------------------------------
  const THEME = "kestrel.theme";
  document.addEventListener("change", (event) => {
    if (!event.target.matches("[data-theme-choice]")) return;
    const theme = event.target.value;
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
    else delete document.documentElement.dataset.theme;
    try {
      if (theme === "system") localStorage.removeItem(THEME);
      else localStorage.setItem(THEME, theme);
    } catch (error) { /* storage blocked: this page only */ }
  });
})();
