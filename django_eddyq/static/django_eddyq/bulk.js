// An "all matching" action that ran out of its time in one request continues by itself: the
// form carries where it stopped. Without JavaScript, the Continue button does the same.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
    const form = document.querySelector("form[data-eddyq-continue]");
    if (form) {
        form.submit();
    }
});
