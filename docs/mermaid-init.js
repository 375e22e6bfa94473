// Turns each ```mermaid block into a diagram with mermaid.min.js, which docs/build.sh copies
// into the built book. Loaded on demand so that pages without diagrams load nothing, and a book
// built without the file still reads (the diagrams' source stays on the page).
(function () {
  const blocks = document.querySelectorAll("code.language-mermaid");
  if (blocks.length === 0) return;
  const script = document.createElement("script");
  script.src = path_to_root + "mermaid.min.js";
  script.onload = function () {
    const root = document.documentElement.classList;
    const dark = ["coal", "navy", "ayu"].some((t) => root.contains(t));
    mermaid.initialize({ startOnLoad: false, theme: dark ? "dark" : "default" });
    const nodes = [];
    blocks.forEach(function (code) {
      const pre = document.createElement("pre");
      pre.className = "mermaid";
      pre.textContent = code.textContent;
      code.parentElement.replaceWith(pre);
      nodes.push(pre);
    });
    mermaid.run({ nodes: nodes });
  };
  document.body.appendChild(script);
})();
