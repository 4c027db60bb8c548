// The chat page's socket: send messages, render streamed replies and stored messages, reconnect
// and resynchronize from the server. Text is always inserted with textContent (never as HTML).
(function () {
  "use strict";

  const chat = document.getElementById("chat");
  if (!chat) return;
  const messagesEl = document.getElementById("messages");
  const form = document.getElementById("composer");
  const input = document.getElementById("text");
  const stopButton = document.getElementById("stop");
  const errorsEl = document.getElementById("errors");
  const connectionEl = document.getElementById("connection");
  const contextEl = document.getElementById("memory-context");
  const eventsEl = document.getElementById("memory-events");

  let lastId = Number(chat.dataset.lastId) || 0;
  const outbox = new Map(); // client_message_id -> text, until the server acknowledges it
  let socket = null;
  let retries = 0;
  let gone = false;

  function newClientId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2);
  }

  function node(tag, className, text) {
    const element = document.createElement(tag);
    if (className) element.className = className;
    if (text !== undefined && text !== null) element.textContent = text;
    return element;
  }

  function renderMessage(m) {
    const article = node("article", "message " + m.role + " status-" + m.status);
    article.dataset.id = m.id;
    if (m.reply_to) article.dataset.replyTo = m.reply_to;
    if (m.client_message_id) article.dataset.clientId = m.client_message_id;
    if (m.role === "tool") {
      const details = node("details");
      details.append(node("summary", null, "tool result: " + m.name), node("pre", null, m.content));
      article.append(details);
      return article;
    }
    if (m.content) article.append(node("div", "content", m.content));
    for (const call of m.tool_calls || []) {
      article.append(node("div", "tool-call", "calls " + call.function.name + "(" + call.function.arguments + ")"));
    }
    if (m.status !== "complete") article.append(node("div", "status", m.status));
    return article;
  }

  function showMessage(m, step) {
    if (messagesEl.querySelector('[data-id="' + m.id + '"]')) return;
    lastId = Math.max(lastId, m.id);
    const element = renderMessage(m);
    const optimistic = m.client_message_id && messagesEl.querySelector('[data-client-id="' + CSS.escape(m.client_message_id) + '"]');
    if (optimistic) {
      optimistic.replaceWith(element);
      return;
    }
    if (m.reply_to && step !== undefined) {
      const streaming = messagesEl.querySelector('[data-stream="' + m.reply_to + ":" + step + '"]');
      if (streaming) {
        streaming.replaceWith(element);
        return;
      }
    }
    messagesEl.append(element);
  }

  function appendDelta(event) {
    const key = event.turn_id + ":" + event.step;
    let bubble = messagesEl.querySelector('[data-stream="' + key + '"]');
    if (!bubble) {
      bubble = node("article", "message assistant streaming");
      bubble.dataset.stream = key;
      bubble.append(node("div", "content", ""));
      messagesEl.append(bubble);
    }
    bubble.firstChild.textContent += event.text;
  }

  function showError(text) {
    errorsEl.replaceChildren(node("p", null, text));
  }

  function send(payload) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(payload));
  }

  const handlers = {
    "chat.ack": (e) => outbox.delete(e.client_message_id),
    "chat.message": (e) => showMessage(e.message, e.step),
    "chat.history": (e) => {
      e.messages.forEach((m) => showMessage(m));
      if (e.more) send({ type: "chat.sync", after_message_id: lastId });
      chat.dataset.pending = e.pending.length;
    },
    "chat.turn": () => { chat.dataset.busy = "true"; },
    "chat.delta": appendDelta,
    "chat.done": (e) => {
      messagesEl.querySelectorAll('[data-stream^="' + e.turn_id + ':"]').forEach((b) => b.remove());
      chat.dataset.busy = "false";
    },
    "chat.retrieval": (e) => {
      eventsEl.append(node("li", null, "retrieved: " + (e.passages.map((p) => p.title).join(", ") || "nothing")));
    },
    "memory.context": (e) => {
      contextEl.textContent =
        "Context: " + e.tokens + " / " + e.context_window + " tokens (trigger " + e.trigger_tokens +
        ", target " + e.target_tokens + "); summary: " + e.summary.type + ", " +
        e.summary.compressed_count + " messages consolidated";
    },
    "memory.compression": (e) => {
      const ev = e.event;
      eventsEl.append(node("li", null, ev.kind + ": " + ev.tokens_before + " → " + ev.tokens_after +
        " tokens, " + ev.messages_summarized + " messages summarized (" + ev.result_type + ")"));
    },
    "error": (e) => {
      if (e.client_message_id) {
        outbox.delete(e.client_message_id);
        const bubble = messagesEl.querySelector('[data-client-id="' + CSS.escape(e.client_message_id) + '"]');
        if (bubble) bubble.classList.add("rejected");
      }
      showError(e.message);
    },
  };

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    chat.dataset.ws = "connecting";
    socket = new WebSocket(scheme + location.host + chat.dataset.wsPath);
    socket.addEventListener("open", () => {
      retries = 0;
      chat.dataset.ws = "open";
      connectionEl.textContent = "connected";
      send({ type: "chat.sync", after_message_id: lastId });
      outbox.forEach((text, id) => send({ type: "chat.send", client_message_id: id, text: text }));
    });
    socket.addEventListener("message", (message) => {
      const event = JSON.parse(message.data);
      const handler = handlers[event.type];
      if (handler) handler(event);
    });
    socket.addEventListener("close", (close) => {
      chat.dataset.ws = "closed";
      if (close.code === 4404) {
        gone = true;
        connectionEl.textContent = "this chat does not exist";
        return;
      }
      const delay = Math.min(30000, 500 * 2 ** retries) * (0.5 + Math.random() / 2);
      retries += 1;
      connectionEl.textContent = "reconnecting…";
      window.setTimeout(() => { if (!gone) connect(); }, delay);
    });
  }

  form.addEventListener("submit", (submit) => {
    submit.preventDefault();
    const text = input.value;
    if (!text.trim()) return;
    const id = newClientId();
    outbox.set(id, text);
    const bubble = node("article", "message user pending");
    bubble.dataset.clientId = id;
    bubble.append(node("div", "content", text));
    messagesEl.append(bubble);
    errorsEl.replaceChildren();
    input.value = "";
    send({ type: "chat.send", client_message_id: id, text: text });
  });
  input.addEventListener("keydown", (key) => {
    if (key.key === "Enter" && !key.shiftKey) {
      key.preventDefault();
      form.requestSubmit();
    }
  });
  stopButton.addEventListener("click", () => send({ type: "chat.stop" }));

  connect();
})();
